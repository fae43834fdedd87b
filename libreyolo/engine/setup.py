"""Everything a run needs before its first step: device, data, network, optimizer, AMP, run folder, event sinks."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from libreyolo import events as ev
from libreyolo.amp import AmpPolicy, resolve_amp
from libreyolo.config import TrainConfig
from libreyolo.data.cache import open_image_cache
from libreyolo.data.config import DataConfig
from libreyolo.data.dataset import AugmentConfig
from libreyolo.data.loader import (
    TrainBatchSampler,
    ValLoader,
    default_val_workers,
    default_workers,
    release_workers,
    train_loader,
    val_loader,
)
from libreyolo.distributed import context as distributed
from libreyolo.distributed.context import DistContext
from libreyolo.engine import autobatch, optim, passes
from libreyolo.engine.bytecode import uncached_bytecode_note
from libreyolo.engine.checkpoint import load_checkpoint, remove_stale_temporaries, resolve_resume_path
from libreyolo.engine.components import build_step_parts, overlap_wanted
from libreyolo.engine.ema import ModelEMA
from libreyolo.engine.epochval import start_val_workers, validation_due
from libreyolo.engine.lossscale import ScaleSearch, scale_reason, set_start_scale, start_loss_scale
from libreyolo.engine.meters import LossMeter
from libreyolo.engine.runners import NAMES as GRAPH_MODE_NAMES
from libreyolo.engine.runners import graph_mode, select_step
from libreyolo.engine.state import cudnn_benchmark_for, seed_everything
from libreyolo.engine.step import EagerStep, StepRunner
from libreyolo.engine.warmup import KernelWarmup, warmup_wanted
from libreyolo.errors import CheckpointError, ConfigError
from libreyolo.families import Family, get_family
from libreyolo.families.base import LossFn, ScheduleFn
from libreyolo.render import RichRenderer
from libreyolo.runs import increment_run_dir, write_args
from libreyolo.tasks import get_task
from libreyolo.tblog import TensorBoardLogger, require_tensorboard

# settings a resumed run may change; everything else comes from the checkpoint so the run continues as it was
RESUME_OVERRIDABLE = {"device", "workers", "log_interval", "tensorboard"}


@dataclass
class TrainSetup:
    cfg: TrainConfig
    family: Family
    size: str
    names: list[str]
    net: nn.Module
    train_net: nn.Module
    device: torch.device
    amp: AmpPolicy
    scaler: torch.amp.GradScaler
    optimizer: torch.optim.Optimizer
    optimizer_name: str
    lr0: float
    momentum: float
    ema: ModelEMA | None
    step: StepRunner  # EagerStep or a CUDA-graph runner (engine/graphs.py, fullstep.py)
    eager: EagerStep  # the eager step (a graph runner's warm-up and fallback path)
    graph_mode: bool | str  # what cuda_graph the run uses (auto resolved): "full", True or False
    graph_reason: str  # one line: why
    schedule: ScheduleFn  # the family's LR schedule, or the default
    loss_fn: LossFn  # the training loss (the step runner holds it too; a family hook may switch its terms)
    val_loss: LossFn
    train_loader: torch.utils.data.DataLoader[Any]
    val_loader: ValLoader
    sampler: TrainBatchSampler
    first_pass: tuple[Any, int] | None  # (iterator, the epoch it ends before) opened here; the trainer takes it
    kernel_warmup: KernelWarmup | None  # running until join_kernel_warmup()
    batch_per_rank: int
    accumulate: int
    warmup_iters: int
    workers: int
    run_dir: Path
    data: DataConfig
    train_images: int
    val_images: int
    meter: LossMeter
    sinks: list[Callable[[ev.Event], None]] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    start_epoch: int = 0
    start_step: int = 0
    resumed: bool = False
    is_main: bool = True
    world_size: int = 1
    dist: DistContext = field(default_factory=DistContext)
    t_start: float = field(default_factory=time.time)
    warm_scale: tuple[float, int | None] | None = None  # the warm-up's float16 start scale and exponent, once joined

    @property
    def last_path(self) -> Path:
        return self.run_dir / "weights" / "last.pt"

    @property
    def best_path(self) -> Path:
        return self.run_dir / "weights" / "best.pt"

    @property
    def kept_net(self) -> nn.Module:
        """The network whose weights checkpoints keep and validation measures: the EMA copy, if there is one."""
        return self.ema.ema if self.ema is not None else self.net

    def scale_value(self) -> float | None:
        return float(self.scaler.get_scale()) if self.scaler.is_enabled() else None

    def amp_event(self) -> ev.Amp:
        """The run's precision as it starts (the epochs' ends report skipped steps with their own)."""
        a, scale = self.amp, self.scale_value()
        return ev.Amp(
            enabled=a.enabled, dtype=a.dtype, scaler=a.scaler, scale=scale, skipped_steps=0, epoch=None, reason=a.reason
        )

    def run_start_event(self) -> ev.RunStart:
        c = self.cfg
        return ev.RunStart(
            run_dir=str(self.run_dir),
            model=f"{self.family.prefix}{self.size}",
            family=self.family.name,
            task=self.family.task,
            nc=len(self.names),
            names=self.names,
            data=str(self.data.yaml_path),
            epochs=c.epochs,
            start_epoch=self.start_epoch,
            batch=self.batch_per_rank * self.world_size,
            batch_per_rank=self.batch_per_rank,
            accumulate=self.accumulate,
            world_size=self.world_size,
            imgsz=c.imgsz,
            device=str(self.device),
            amp=self.amp.enabled,
            amp_dtype=self.amp.dtype,
            cuda_graph=str(c.cuda_graph).lower(),
            cuda_graph_mode=GRAPH_MODE_NAMES[self.graph_mode],
            cuda_graph_reason=self.graph_reason,
            loss_terms=list(self.family.loss_terms),
            metrics=list(get_task(self.family.task).metric_names),
            workers=self.workers,
            optimizer=f"{self.optimizer_name}(lr={self.lr0:g}, momentum={self.momentum:g})",
            steps_per_epoch=self.sampler.batches_per_epoch(),
            train_images=self.train_images,
            val_images=self.val_images,
            params=sum(p.numel() for p in self.net.parameters()),
            pid=os.getpid(),
            resumed=self.resumed,
            config={k: v for k, v in c.to_dict().items()},
        )

    def join_kernel_warmup(self) -> None:
        """The kernel warm-up's end (engine/warmup.py): its backward, which no graph capture may run beside. What
        failed, if it did, becomes a setup note (once); the start loss scale it found is kept in warm_scale."""
        warmup, self.kernel_warmup = self.kernel_warmup, None
        if warmup is not None:
            warmup.join()
            self.notes += [warmup.failure] if warmup.failure else []
            self.warm_scale = warmup.scale

    def start_scale(self, img: torch.Tensor | None, targets: torch.Tensor | None, mask: Any) -> tuple[float, str]:
        """A new float16 run's start loss scale, set on the scaler: the warm-up's, read off the first batch, or
        (where it found none) the probe's on this first batch (engine/lossscale.py). -> (scale, why)."""
        if self.warm_scale is not None:
            scale, exp = self.warm_scale
            set_start_scale(self.scaler, scale)
            return scale, scale_reason(scale, exp)
        assert img is not None and targets is not None  # only the warm-up's scale is set before the first batch
        return start_loss_scale(self.eager, self.train_net, self.scaler, self.dist, self.device, img, targets, mask)

    def close(self) -> None:
        self.join_kernel_warmup()  # a run that failed before its first step may still be warming up
        try:
            self.eager.sync()  # a run that failed inside an accumulation window may have a backward running
            self.step.close()  # its graphs and their memory pools: a process that trains again gets the memory back
        except Exception:  # noqa: BLE001,S110  (that run's own error is the one it reports)
            pass
        release_workers(self.train_loader)
        self.val_loader.close()
        for fn in self.closers:
            fn()


def _resume_config(trainer: Any) -> dict[str, Any]:
    cfg = trainer.cfg
    path = resolve_resume_path(cfg)
    ckpt = load_checkpoint(path)
    if "train" not in ckpt:
        raise CheckpointError(f"{path} holds weights only (no train state); resume needs a run's weights/last.pt")
    args = dict(ckpt["train_args"])
    if ckpt["epoch"] >= args["epochs"]:
        raise CheckpointError(
            f"{path} already finished all {args['epochs']} epochs; nothing to resume. Start a new run with model={path}"
        )
    args.update({k: getattr(cfg, k) for k in trainer.user_keys & RESUME_OVERRIDABLE})
    args["resume"] = str(path)
    trainer.cfg = TrainConfig.from_overrides(args, family=get_family(ckpt["family"]))
    trainer.cfg.callbacks = cfg.callbacks
    trainer.model.load_record(ckpt)
    return ckpt


def build_setup(trainer: Any, undo: list[Callable[[], None]] | None = None) -> TrainSetup:
    """Everything a run needs, built once. undo collects what the caller must release if this raises part way:
    the training loader's workers, which start before the network is built."""
    undo = [] if undo is None else undo
    ckpt = _resume_config(trainer) if trainer.cfg.resume else None
    cfg: TrainConfig = trainer.cfg
    # under torchrun (or the spawn launcher's workers) this joins the process group and picks cuda:LOCAL_RANK
    device, dist = distributed.start(cfg.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    amp = resolve_amp(cfg.amp, cfg.amp_dtype, device)  # raises before any work for an impossible request
    if cfg.tensorboard:
        require_tensorboard()  # as early: the error says how to install it
    notes: list[str] = [n for n in [uncached_bytecode_note(torch)] if n]
    if dist.world_size > 1 and not trainer.model.family.supports_ddp:
        raise ConfigError(distributed.family_message(trainer.model.family.name, cfg.device, dist.world_size))

    task = get_task(trainer.model.family.task).implementation()  # how this task's datasets are read and viewed
    with dist.main_first():  # rank 0 generates the built-in dataset and writes label caches; the others reuse them
        data = task.load_data(cfg.data)
        notes += data.notes
        train_ls = task.scan(data, "train", notes, cfg.allow_empty)
        val_ls = task.scan(data, "val", notes, False)
    if ckpt is None:
        cfg.fill_unset(data.suggested, trainer.user_keys)
    seed_everything(cfg.seed, cfg.deterministic)  # cuDNN timing off during the autobatch probe; set below

    model = trainer.model
    net = model.prepare_for_training(data.names, fresh=ckpt is None)
    family = model.family

    # `batch` is the global batch: accumulation, weight decay and the loss scale follow it; loaders use the per-rank
    # share
    probe = lambda: autobatch.probe_model(family, model.size, data.nc, cfg, device)  # noqa: E731
    sized = cfg.batch == -1  # autobatch: the batch fills the memory
    batch = cfg.batch = autobatch.resolve_global_batch(cfg, device, dist, probe, amp.autocast_dtype, notes)
    batch_per_rank = distributed.split_batch(batch, dist.world_size)
    workers = (
        cfg.workers
        if cfg.workers is not None
        else default_workers(batch_per_rank, dist.local_world_size if device.type == "cuda" else 0)
    )
    pin = device.type == "cuda"
    # --- image cache (data/cache.py): cache=ram|disk serves both splits (one RAM copy per host for all ranks);
    # fallbacks and bad files become notes
    caches = [
        open_image_cache(cfg.cache, ls, cfg.imgsz, split, notes, progress=dist.is_main)
        for split, ls in (("train", train_ls), ("val", val_ls))
    ]
    dataset = task.dataset
    train_ds = dataset(
        train_ls, cfg.imgsz, augment=True, hyp=AugmentConfig.from_config(cfg), seed=cfg.seed, image_source=caches[0]
    )
    val_ds = dataset(val_ls, cfg.imgsz, augment=False, image_source=caches[1])
    cache_closers = [c.close for c in caches if c is not None]  # the last user on the host deletes a RAM cache
    # --- end image cache
    tl = train_loader(train_ds, batch_per_rank, workers, cfg.seed, pin, dist.rank, dist.world_size, device)
    # persistent validation workers: no start-up each epoch, and they decode during an epoch's last steps
    vl = val_loader(val_ds, min(batch_per_rank * 2, 64), default_val_workers(workers), pin, persistent=dist.is_main)
    start_epoch, start_step = (int(ckpt["epoch"]), int(ckpt["step"])) if ckpt is not None else (0, 0)
    start_val_workers(vl, device, dist.is_main, validation_due(cfg, start_epoch))
    undo.append(vl.close)
    sampler = tl.batch_sampler
    assert isinstance(sampler, TrainBatchSampler)
    nb = sampler.batches_per_epoch()
    # the first loader pass starts now: its workers decode the first batches while the network, optimizer and
    # step are built (unless a family hook is due first; the trainer opens that pass after the hook)
    first_pass, first = None, None
    if not passes.hook_due(cfg, family.hooks, start_epoch, start_epoch):
        it, until = passes.open_pass(cfg, family.hooks, sampler, tl, start_epoch, start_epoch, start_step)
        first = passes.Peekable(it)
        first_pass = first, until
        undo.append(lambda: release_workers(tl))
    torch.backends.cudnn.benchmark = cudnn_benchmark_for(cfg.cudnn_benchmark, cfg.deterministic, nb * cfg.epochs)

    # DDP: eager runs use torch's DDP wrapper, which hooks the registered parameters' gradients (no flat storage
    # then); graph runs (NCCL) keep flat gradients and average them with one all-reduce of their own
    nccl = dist.nccl_version()
    graphs = graph_mode(cfg.cuda_graph, family, device, dist.world_size, dist.backend, nccl)[0] is not False
    wrapped = dist.world_size > 1 and not graphs
    warmup = None
    if warmup_wanted(device, dist.world_size, torch.backends.cudnn.benchmark):  # beside the rest of the setup
        # on the run's first batch, which also gives a new float16 run its start loss scale (engine/lossscale.py)
        make_batch = first.peek if first is not None else lambda: tl.collate_fn([train_ds[0]] * batch_per_rank)
        search = ScaleSearch() if amp.scaler and ckpt is None and first is not None else None
        beside = (family.loss(net, cfg), family.example_outputs) if family.example_outputs is not None else None
        warmup = KernelWarmup(make_batch, family.loss(net, cfg), device, search, beside)
        undo.append(warmup.join)
    parts = build_step_parts(
        family,
        net,
        cfg,
        device,
        batch,
        len(train_ds),
        reduce_normalizer=dist.normalizer_reducer(),
        flat=not wrapped,
        prepare=lambda m: distributed.sync_batchnorm(m, dist, device, cfg.sync_bn, batch_per_rank, notes),
        warmup=warmup,
    )
    eager = parts.eager_step(cfg.grad_clip)
    if wrapped:
        eager.net = dist.wrap(parts.train_net, device)  # the step runs DDP; checkpoints and EMA keep the plain module
    elif graphs:
        dist.broadcast_module(parts.train_net)  # what DDP's constructor would have done: rank 0's weights everywhere
        eager.grad_reduce = dist.grad_reducer()
    # the most target slots a training batch can need, known before the first capture, so the whole step is
    # captured once (not re-captured when a batch with more objects per image comes)
    capacity = passes.target_capacity(cfg, train_ls.labels, start_epoch) if graphs else None
    step, graph_mode_, graph_reason = select_step(
        eager, parts, cfg, family, device, dist.world_size, trainer.emit, dist.backend, nccl, capacity
    )
    eager.overlap_backward = step is eager and overlap_wanted(cfg, eager, device, parts.accumulate, sized)

    if ckpt is not None:
        run_dir = Path(ckpt["train"]["run_dir"])
    else:  # rank 0 picks exp, exp2, ...; every rank uses its choice
        run_dir = dist.broadcast(increment_run_dir(cfg.project, cfg.name, cfg.exist_ok) if dist.is_main else None)
    if dist.is_main:
        (run_dir / "weights").mkdir(parents=True, exist_ok=True)
        if stale := remove_stale_temporaries(run_dir / "weights"):
            notes.append(f"removed {len(stale)} unfinished checkpoint file(s) of a killed run: {', '.join(stale)}")
        write_args(run_dir, cfg.to_dict())

    s = TrainSetup(
        cfg=cfg,
        family=family,
        size=model.size,
        names=list(data.names),
        net=net,
        train_net=parts.train_net,
        device=device,
        amp=parts.amp,
        scaler=parts.scaler,
        optimizer=parts.optimizer,
        optimizer_name=parts.optimizer_name,
        lr0=parts.lr0,
        momentum=parts.momentum,
        ema=parts.ema,
        step=step,
        eager=eager,
        graph_mode=graph_mode_,
        graph_reason=graph_reason,
        schedule=family.schedule if family.schedule is not None else optim.apply_schedule,
        loss_fn=parts.loss_fn,
        val_loss=family.loss(net, cfg),
        train_loader=tl,
        val_loader=vl,
        sampler=sampler,
        first_pass=first_pass,
        kernel_warmup=warmup,
        start_epoch=start_epoch,
        start_step=start_step,
        resumed=ckpt is not None,
        batch_per_rank=batch_per_rank,
        accumulate=parts.accumulate,
        warmup_iters=max(round(cfg.warmup_epochs * nb), 100) if cfg.warmup_epochs > 0 else 0,
        workers=workers,
        run_dir=run_dir,
        data=data,
        train_images=len(train_ds),
        val_images=len(val_ds),
        meter=LossMeter(device, len(family.loss_terms)),
        notes=notes,
        is_main=dist.is_main,
        world_size=dist.world_size,
        dist=dist,
    )
    s.closers = [dist.close, *cache_closers]
    if dist.is_main:  # only rank 0 writes events and runs the renderer and user callbacks
        writer = ev.EventWriter(run_dir / "events.jsonl")
        renderer = RichRenderer()
        s.sinks = [writer.write, renderer, *cfg.callbacks]
        s.closers = [renderer.close, writer.close, *s.closers]
        if cfg.tensorboard:
            tb = TensorBoardLogger(run_dir / "tensorboard")
            s.sinks.insert(2, tb)
            s.closers.insert(0, tb.close)
    trainer.s = s
    if ckpt is not None:  # the kernel warm-up's backward may still run: it touches nothing restored here
        trainer.restore(ckpt)
    dist.seed_rank(cfg.seed)
    return s
