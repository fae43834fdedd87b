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
from libreyolo.amp import AmpPolicy
from libreyolo.config import TrainConfig
from libreyolo.data.config import DataConfig
from libreyolo.data.loader import (
    TrainBatchSampler,
    ValLoader,
    release_workers,
)
from libreyolo.distributed import context as distributed
from libreyolo.distributed import elastic
from libreyolo.distributed.context import DistContext
from libreyolo.engine import autobatch, optim
from libreyolo.engine import builders as B
from libreyolo.engine.builders import Loaders
from libreyolo.engine.checkpoint import load_resumable, resolve_resume_path
from libreyolo.engine.components import StepParts
from libreyolo.engine.ema import ModelEMA
from libreyolo.engine.lossscale import scale_reason, set_start_scale, start_loss_scale
from libreyolo.engine.meters import LossMeter
from libreyolo.engine.runners import NAMES as GRAPH_MODE_NAMES
from libreyolo.engine.seams import TrainableModel
from libreyolo.engine.state import cudnn_benchmark_for, seed_everything
from libreyolo.engine.step import EagerStep, StepRunner
from libreyolo.engine.warmup import KernelWarmup
from libreyolo.errors import CheckpointError
from libreyolo.families import Family, get_family
from libreyolo.families.base import LossFn, ScheduleFn
from libreyolo.tasks import get_task

# settings a resumed run may change; everything else comes from the checkpoint so the run continues as it was. The
# loggers and experiment trackers only watch the run: a resume may drop one whose package or server is gone, or add one
RESUME_OVERRIDABLE = {"device", "workers", "log_interval", "tensorboard", "mlflow", "wandb"}


@dataclass
class TrainSetup:
    """A run's state as the setup built it. The step's parts (train net, optimizer, scaler, EMA, loss) and the
    loaders are held whole and read through the properties below, under the names the loop and checkpoints use."""

    cfg: TrainConfig
    family: Family
    size: str
    names: list[str]
    net: nn.Module
    device: torch.device
    parts: StepParts
    loaders: Loaders
    step: StepRunner  # EagerStep or a CUDA-graph runner (engine/netgraph.py, fullstep.py)
    eager: EagerStep  # the eager step (a graph runner's warm-up and fallback path)
    graph_mode: bool | str  # what cuda_graph the run uses (auto resolved): "full", True or False
    graph_reason: str  # one line: why
    # whether each validation replays its network from a CUDA graph (eval/graphed.py): on a GPU's main rank unless
    # cuda_graph=false, whatever the training step's mode (a family without a capture plan still validates graphed)
    val_graph: bool
    schedule: ScheduleFn  # the family's LR schedule, or the default
    val_loss: LossFn
    first_pass: tuple[Any, int] | None  # (iterator, the epoch it ends before) opened here; the trainer takes it
    kernel_warmup: KernelWarmup | None  # running until join_kernel_warmup()
    batch_per_rank: int
    warmup_iters: int
    run_dir: Path
    data: DataConfig
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

    # the step's parts
    @property
    def train_net(self) -> nn.Module:
        return self.parts.train_net

    @property
    def amp(self) -> AmpPolicy:
        return self.parts.amp

    @property
    def scaler(self) -> torch.amp.GradScaler:
        return self.parts.scaler

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.parts.optimizer

    @property
    def optimizer_name(self) -> str:
        return self.parts.optimizer_name

    @property
    def lr0(self) -> float:
        return self.parts.lr0

    @property
    def momentum(self) -> float:
        return self.parts.momentum

    @property
    def ema(self) -> ModelEMA | None:
        return self.parts.ema

    @property
    def loss_fn(self) -> LossFn:
        """The training loss (the step runner holds it too; a family hook may switch its terms)."""
        return self.parts.loss_fn

    @property
    def accumulate(self) -> int:
        return self.parts.accumulate

    # the loaders
    @property
    def train_loader(self) -> torch.utils.data.DataLoader[Any]:
        return self.loaders.train

    @property
    def val_loader(self) -> ValLoader:
        return self.loaders.val

    @property
    def sampler(self) -> TrainBatchSampler:
        return self.loaders.sampler

    @property
    def workers(self) -> int:
        return self.loaders.workers

    @property
    def train_images(self) -> int:
        return self.loaders.train_images

    @property
    def val_images(self) -> int:
        return self.loaders.val_images

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

    def epoch_amp_event(self, epoch: int, got: dict[str, Any]) -> ev.Amp:
        """float16: an epoch's skipped steps and loss scale (got: the host copies of the step's skipped count and the
        scaler's scale, where the step keeps them on the device), the step's count started again."""
        skipped = int(got["skipped"]) if "skipped" in got else 0
        scale = float(got["scale"]) if "scale" in got else self.scale_value()
        self.step.skipped = None
        why = f"epoch {epoch + 1}: {skipped} optimizer step(s) skipped for inf/NaN gradients, loss scale {scale:g}"
        return ev.Amp(
            enabled=True, dtype=self.amp.dtype, scaler=True, scale=scale, skipped_steps=skipped, epoch=epoch, reason=why
        )

    def take_vram_peak(self, epoch: int) -> ev.Vram | None:
        """An epoch's peak device memory as its vram event (None off CUDA); the peak counters start again."""
        if self.device.type != "cuda":
            return None
        vram = ev.Vram(
            epoch=epoch,
            peak_allocated_mb=torch.cuda.max_memory_allocated(self.device) / 2**20,
            peak_reserved_mb=torch.cuda.max_memory_reserved(self.device) / 2**20,
            device=str(self.device),
        )
        torch.cuda.reset_peak_memory_stats(self.device)
        return vram

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


def resolve_resume(model: TrainableModel, cfg: TrainConfig) -> tuple[TrainConfig, dict[str, Any] | None]:
    """resume=: the run's config comes from its last.pt (but for RESUME_OVERRIDABLE keys the user set) and the model
    takes its weights. -> (the run's config, the checkpoint, or None for a new run)."""
    restarted = None if cfg.resume else elastic.restarted_run(cfg.project)
    if restarted is not None:  # torchrun restarted the group: continue the job's run where its last.pt is
        if not (restarted / "weights" / "last.pt").exists():  # it failed before its first save: start it again there
            cfg.name, cfg.exist_ok = restarted.name, True
            return cfg, None
        cfg.resume = str(restarted / "weights" / "last.pt")
    if not cfg.resume:
        return cfg, None
    path = resolve_resume_path(cfg)
    ckpt = load_resumable(path)  # the previous last.pt where this one cannot be read
    if restarted is not None:
        attempt = f"torchrun restarted the job (attempt {elastic.restart_count() + 1})"
        ckpt["notes"].append(f"{attempt}: resuming its run {restarted} from epoch {ckpt['epoch'] + 1}")
    if "train" not in ckpt:
        raise CheckpointError(f"{path} holds weights only (no train state); resume needs a run's weights/last.pt")
    args = dict(ckpt["train_args"])
    if ckpt["epoch"] >= args["epochs"]:
        raise CheckpointError(
            f"{path} already finished all {args['epochs']} epochs; nothing to resume. Start a new run with model={path}"
        )
    args.update({k: getattr(cfg, k) for k in cfg.user_keys & RESUME_OVERRIDABLE})
    args["resume"] = str(path)
    resumed = TrainConfig.from_overrides(args, family=get_family(ckpt["family"]))
    resumed.callbacks, resumed.user_keys = cfg.callbacks, cfg.user_keys
    model.load_record(ckpt)
    return resumed, ckpt


def build_run(
    model: TrainableModel,
    cfg: TrainConfig,
    emit: Callable[[ev.Event], None],
    ckpt: dict[str, Any] | None = None,
    undo: list[Callable[[], None]] | None = None,
) -> TrainSetup:
    """Everything a run needs, built once, as a recipe (engine/builders.py), from resolve_resume's config and
    checkpoint (the caller puts the checkpoint's train state back once this returns). undo collects what the caller
    must release if this raises part way: the loaders' workers, which start before the network is built."""
    undo = [] if undo is None else undo
    family: Family = model.family
    device, dist, amp, notes = B.start_device(cfg, family)
    task = get_task(family.task).implementation()  # how this task's datasets are read and viewed
    data, train_ls, val_ls = B.read_data(task, cfg, dist, notes)
    if ckpt is None:
        cfg.fill_unset(data.suggested)
    seed_everything(cfg.seed, cfg.deterministic)  # cuDNN timing off during the autobatch probe; set below
    net = model.prepare_for_training(data.names, fresh=ckpt is None)

    # `batch` is the global batch: accumulation, weight decay and the loss scale follow it; loaders use the per-rank
    # share
    probe = lambda: autobatch.probe_model(family, model.size, data.nc, cfg, device)  # noqa: E731
    sized = cfg.batch == -1  # autobatch: the batch fills the memory
    batch = cfg.batch = autobatch.resolve_global_batch(cfg, device, dist, probe, amp.autocast_dtype, notes)
    batch_per_rank = distributed.split_batch(batch, dist.world_size)
    start_epoch, start_step = (int(ckpt["epoch"]), int(ckpt["step"])) if ckpt is not None else (0, 0)
    loaders = B.build_loaders(task, cfg, (train_ls, val_ls), batch_per_rank, device, dist, start_epoch, notes, undo)
    first_pass = B.open_first_pass(cfg, family, loaders, start_epoch, start_step, undo)
    nb = loaders.sampler.batches_per_epoch()
    torch.backends.cudnn.benchmark = cudnn_benchmark_for(cfg.cudnn_benchmark, cfg.deterministic, nb * cfg.epochs)
    warmup = B.start_kernel_warmup(family, net, cfg, device, dist, amp, first_pass, loaders, ckpt is not None, undo)
    step = B.build_step(
        family, net, cfg, device, dist, batch, batch_per_rank, loaders.train_images, train_ls.labels, start_epoch,
        warmup, emit, sized, notes,
    )  # fmt: skip
    run_dir = B.make_run_dir(cfg, ckpt, dist, notes, net)
    s = TrainSetup(
        cfg=cfg,
        family=family,
        size=model.size,
        names=list(data.names),
        net=net,
        device=device,
        parts=step.parts,
        loaders=loaders,
        step=step.runner,
        eager=step.eager,
        graph_mode=step.mode,
        graph_reason=step.reason,
        val_graph=device.type == "cuda" and cfg.cuda_graph is not False and dist.is_main,
        schedule=family.schedule if family.schedule is not None else optim.apply_schedule,
        val_loss=family.loss(net, cfg),
        first_pass=first_pass,
        kernel_warmup=warmup,
        batch_per_rank=batch_per_rank,
        warmup_iters=max(round(cfg.warmup_epochs * nb), 100) if cfg.warmup_epochs > 0 else 0,
        run_dir=run_dir,
        data=data,
        meter=LossMeter(device, len(family.loss_terms)),
        notes=notes,
        start_epoch=start_epoch,
        start_step=start_step,
        resumed=ckpt is not None,
        is_main=dist.is_main,
        world_size=dist.world_size,
        dist=dist,
    )
    s.sinks, closers = B.event_sinks(cfg, run_dir, dist.is_main)
    s.closers = [*closers, dist.close, *loaders.closers]
    return s
