"""The small builders engine/setup.py's build_run reads as a recipe, top to bottom: the device, the data, the
loaders and their first pass, the kernel warm-up, the step, the run folder, the event sinks. Each takes what it
needs and returns what it made; `undo` collects what the caller must release if a later builder raises."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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
from libreyolo.data.labels import LabelSet
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
from libreyolo.distributed import elastic
from libreyolo.distributed.context import DistContext
from libreyolo.engine import passes
from libreyolo.engine.bytecode import uncached_bytecode_note
from libreyolo.engine.checkpoint import open_run_dir
from libreyolo.engine.components import StepParts, build_step_parts, overlap_wanted
from libreyolo.engine.lossscale import ScaleSearch
from libreyolo.engine.runners import graph_mode, select_step
from libreyolo.engine.step import EagerStep, StepRunner
from libreyolo.engine.warmup import KernelWarmup, warmup_wanted
from libreyolo.errors import ConfigError
from libreyolo.families import Family
from libreyolo.nn.nms import check_nms
from libreyolo.render import RichRenderer
from libreyolo.runs import increment_run_dir, resumed_run_dir, unlock_run_dir
from libreyolo.tasks.base import TaskImpl
from libreyolo.tblog import TensorBoardLogger, require_tensorboard

Undo = list[Callable[[], None]]


def start_device(cfg: TrainConfig, family: Family) -> tuple[torch.device, DistContext, AmpPolicy, list[str]]:
    """The run's device (under torchrun or the spawn launcher's workers: joins the process group and takes
    cuda:LOCAL_RANK), its precision, and the first setup notes. Raises before any work for what cannot run."""
    device, dist = distributed.start(cfg.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    check_nms(device)  # a torchvision built for another torch fails here, not at the first validation
    amp = resolve_amp(cfg.amp, cfg.amp_dtype, device)
    if cfg.tensorboard:
        require_tensorboard()  # as early: the error says how to install it
    if dist.world_size > 1 and not family.supports_ddp:
        raise ConfigError(distributed.family_message(family.name, cfg.device, dist.world_size))
    return device, dist, amp, [n for n in [uncached_bytecode_note(torch)] if n]


def read_data(task: TaskImpl, cfg: TrainConfig, dist: DistContext, notes: list[str]) -> tuple[DataConfig, Any, Any]:
    """The dataset's description and its train and val splits scanned (rank 0 first: it generates the built-in
    dataset and writes the label caches, which the other ranks reuse)."""
    with dist.main_first():
        data = task.load_data(cfg.data)
        notes += data.notes
        return data, task.scan(data, "train", notes, cfg.allow_empty), task.scan(data, "val", notes, False)


@dataclass
class Loaders:
    train: torch.utils.data.DataLoader[Any]
    val: ValLoader
    sampler: TrainBatchSampler
    train_images: int
    val_images: int
    workers: int
    closers: list[Callable[[], None]]  # the image caches' (the last user on a host deletes a RAM cache)
    first_item: Callable[[], Any]  # a batch of the training set's first image (the warm-up's, without a first pass)


def build_loaders(
    task: TaskImpl,
    cfg: TrainConfig,
    splits: tuple[LabelSet, LabelSet],
    batch_per_rank: int,
    device: torch.device,
    dist: DistContext,
    start_epoch: int,
    notes: list[str],
    undo: Undo,
) -> Loaders:
    """The task's training and validation views of the splits (cache=ram|disk serves both: one RAM copy per host for
    all ranks), their loaders, and the persistent validation workers started (they decode during an epoch's last
    steps, no start-up each epoch)."""
    workers = cfg.workers
    if workers is None:
        workers = default_workers(batch_per_rank, dist.local_world_size if device.type == "cuda" else 0)
    pin = device.type == "cuda"
    caches = [
        open_image_cache(cfg.cache, ls, cfg.imgsz, split, notes, progress=dist.is_main)
        for split, ls in zip(("train", "val"), splits)
    ]
    hyp = AugmentConfig.from_config(cfg)
    train_ds = task.dataset(splits[0], cfg.imgsz, augment=True, hyp=hyp, seed=cfg.seed, image_source=caches[0])
    val_ds = task.dataset(splits[1], cfg.imgsz, augment=False, image_source=caches[1])
    tl = train_loader(train_ds, batch_per_rank, workers, cfg.seed, pin, dist.rank, dist.world_size, device)
    vl = val_loader(val_ds, min(batch_per_rank * 2, 64), default_val_workers(workers), pin, persistent=dist.is_main)
    start_val_workers(vl, device, dist.is_main, passes.validation_due(cfg, start_epoch))
    undo.append(vl.close)
    sampler = tl.batch_sampler
    assert isinstance(sampler, TrainBatchSampler)
    first_item = lambda: tl.collate_fn([train_ds[0]] * batch_per_rank)  # noqa: E731
    closers = [c.close for c in caches if c is not None]
    return Loaders(tl, vl, sampler, len(train_ds), len(val_ds), workers, closers, first_item)


def start_val_workers(val_loader: ValLoader, device: torch.device, is_main: bool, due: bool) -> None:
    """The persistent validation workers' first pass starts as soon as their loader exists (due: the first epoch
    validates). Forked there, before the warm-up, they cost the start their own fork only. Forked beside the
    warm-up's backward instead, the forks held that backward (the start's critical path) 0.3 s longer; in the first
    epoch's prefetch they held the loop until the GPU ran out of queued steps for 0.17 s
    (docs/performance-archive.md, 2026-12-03 and 2026-12-04)."""
    if device.type == "cuda" and is_main and due and val_loader.persistent_workers:
        val_loader.prefetch()


def open_first_pass(
    cfg: TrainConfig, family: Family, loaders: Loaders, start_epoch: int, start_step: int, undo: Undo
) -> tuple[Any, int] | None:
    """The first loader pass, started now: its workers decode the first batches while the network, optimizer and
    step are built. None where a family hook is due first (the trainer opens that pass after the hook).
    -> (the pass, readable ahead (engine/passes.Peekable), the epoch it ends before)."""
    if passes.hook_due(cfg, family.hooks, start_epoch, start_epoch):
        return None
    it, until = passes.open_pass(
        cfg, family.hooks, loaders.sampler, loaders.train, start_epoch, start_epoch, start_step
    )
    undo.append(lambda: release_workers(loaders.train))
    return passes.Peekable(it), until


def start_kernel_warmup(
    family: Family,
    net: nn.Module,
    cfg: TrainConfig,
    device: torch.device,
    dist: DistContext,
    amp: AmpPolicy,
    first_pass: tuple[Any, int] | None,
    loaders: Loaders,
    resumed: bool,
    undo: Undo,
) -> KernelWarmup | None:
    """A process's first forward and backward, beside the rest of the setup (engine/warmup.py), on the run's first
    batch, which also gives a new float16 run its start loss scale (engine/lossscale.py)."""
    if not warmup_wanted(device, dist.world_size, torch.backends.cudnn.benchmark):
        return None
    make_batch = first_pass[0].peek if first_pass is not None else loaders.first_item
    search = ScaleSearch() if amp.scaler and not resumed and first_pass is not None else None
    beside = (family.loss(net, cfg), family.example_outputs) if family.example_outputs is not None else None
    warmup = KernelWarmup(make_batch, family.loss(net, cfg), device, search, beside)
    undo.append(warmup.join)
    return warmup


@dataclass
class Step:
    parts: StepParts
    eager: EagerStep
    runner: StepRunner  # the eager step or a CUDA-graph runner
    mode: bool | str  # the cuda_graph mode the run uses: "full", True or False
    reason: str


def build_step(
    family: Family,
    net: nn.Module,
    cfg: TrainConfig,
    device: torch.device,
    dist: DistContext,
    batch: int,
    batch_per_rank: int,
    train_images: int,
    labels: list[Any],
    start_epoch: int,
    warmup: KernelWarmup | None,
    emit: Callable[[ev.Event], None],
    autobatch: bool,
    notes: list[str],
) -> Step:
    """The step's parts (train net, optimizer, EMA, scaler, loss), the eager step and the runner cuda_graph picks.
    Under DDP an eager run uses torch's DDP wrapper, which hooks the registered parameters' gradients (no flat storage
    then); a graph run (NCCL) keeps flat gradients and averages them with one all-reduce of its own."""
    nccl = dist.nccl_version()
    decided = graph_mode(cfg.cuda_graph, family, device, dist.world_size, dist.backend, nccl)  # once, for the run
    graphs = decided[0] is not False
    wrapped = dist.world_size > 1 and not graphs
    parts = build_step_parts(
        family,
        net,
        cfg,
        device,
        batch,
        train_images,
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
    capacity = passes.target_capacity(cfg, labels, start_epoch) if graphs else None
    runner, mode, reason = select_step(
        eager, parts, cfg, family, device, dist.world_size, emit, dist.backend, nccl, capacity, decided
    )
    eager.overlap_backward = runner is eager and overlap_wanted(cfg, eager, device, parts.accumulate, autobatch)
    return Step(parts, eager, runner, mode, reason)


def make_run_dir(
    cfg: TrainConfig, ckpt: dict[str, Any] | None, dist: DistContext, notes: list[str], net: nn.Module
) -> Path:
    """runs/train/exp, exp2, ... (rank 0 picks, every rank uses its choice), or the folder a resumed run's last.pt
    lies in; rank 0 then takes the folder's writer lock and prepares it (engine/checkpoint.open_run_dir)."""
    if ckpt is not None:
        run_dir = resumed_run_dir(str(cfg.resume), ckpt["train"].get("run_dir"), notes)
        notes += ckpt.pop("notes", [])
    else:
        run_dir = dist.broadcast(increment_run_dir(cfg.project, cfg.name, cfg.exist_ok) if dist.is_main else None)
    if dist.is_main:
        open_run_dir(run_dir, cfg.to_dict(), net, str(cfg.resume) if ckpt is not None else None, notes)
        elastic.mark(run_dir)  # under torchrun: a restart of the job continues this folder (distributed/elastic.py)
    return run_dir


def event_sinks(
    cfg: TrainConfig, run_dir: Path, is_main: bool
) -> tuple[list[Callable[[ev.Event], None]], list[Callable[[], None]]]:
    """Where the events go (rank 0 only: events.jsonl, the rich renderer, TensorBoard, the user's callbacks), and
    what closes them, in order."""
    if not is_main:
        return [], []
    writer = ev.EventWriter(run_dir / "events.jsonl")
    renderer = RichRenderer()
    sinks: list[Callable[[ev.Event], None]] = [writer.write, renderer]
    closers: list[Callable[[], None]] = [renderer.close, writer.close, lambda: unlock_run_dir(run_dir)]
    if cfg.tensorboard:
        tb = TensorBoardLogger(run_dir / "tensorboard")
        sinks.append(tb)
        closers.insert(0, tb.close)
    return [*sinks, *cfg.callbacks], closers
