"""The parts of a training step, built the same way for the trainer and for `libreyolo bench step`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from libreyolo.amp import AmpPolicy, make_scaler, resolve_amp
from libreyolo.engine import optim
from libreyolo.engine.ema import ModelEMA
from libreyolo.engine.flat import FlatParams
from libreyolo.engine.step import EagerStep
from libreyolo.engine.warmup import KernelWarmup
from libreyolo.families.base import LossFn, Reduce

if TYPE_CHECKING:
    from libreyolo.config import TrainConfig
    from libreyolo.families import Family


@dataclass
class StepParts:
    net: nn.Module  # the detector (what is validated and saved)
    train_net: nn.Module  # what the step runs (detector + training-only heads)
    optimizer: torch.optim.Optimizer
    optimizer_name: str
    lr0: float
    momentum: float
    scaler: torch.amp.GradScaler
    ema: ModelEMA | None
    loss_fn: LossFn
    amp: AmpPolicy
    accumulate: int
    batch_scale: float
    channels_last: bool  # the network's memory format (CUDA only), which inputs must follow
    flat: FlatParams | None = None

    def eager_step(self, grad_clip: float) -> EagerStep:
        return EagerStep(
            self.train_net,
            self.loss_fn,
            self.optimizer,
            self.scaler,
            self.ema,
            self.amp.autocast_dtype,
            grad_clip,
            self.batch_scale,
            self.channels_last,
            self.flat,
        )


def overlap_wanted(cfg: TrainConfig, step: EagerStep, device: torch.device, accumulate: int, autobatch: bool) -> bool:
    """Whether the eager step runs a micro-step's backward beside the next forward (engine/overlap.py): asked for
    (cfg.overlap_backward), on a CUDA device, where the step is host-bound; with flat parameters (DDP's wrapper
    expects each backward to end before the next forward); with micro-steps to overlap (accumulate > 1: an optimizer
    step needs its backward done); and not when autobatch sized the batch to the memory (two micro-steps'
    activations are alive at once)."""
    return (
        bool(cfg.overlap_backward)
        and device.type == "cuda"
        and step.flat is not None
        and accumulate > 1
        and not autobatch
    )


NOMINAL_BATCH = 64  # nbs=auto in a long run, and autobatch's cap: the Ultralytics convention the default LRs assume
LONG_RUN_STEPS = 10_000  # optimizer steps (at NOMINAL_BATCH) above which a run counts as long


def resolve_nbs(nbs: int | str, batch: int, n_train: int, epochs: int) -> int:
    """nbs=auto: NOMINAL_BATCH for long runs; for shorter ones the batch itself, an optimizer step per batch
    (measured on the H200 in docs/performance.md: more steps reach a target mAP sooner in short runs)."""
    if nbs != "auto":
        return int(nbs)
    return NOMINAL_BATCH if optimizer_steps(n_train, batch, NOMINAL_BATCH, epochs) > LONG_RUN_STEPS else batch


def optimizer_steps(n_train: int, batch: int, nbs: int, epochs: int) -> int:
    return -(-n_train // max(batch, nbs)) * epochs


def build_step_parts(
    family: Family,
    net: nn.Module,
    cfg: TrainConfig,
    device: torch.device,
    batch: int,
    n_train: int,
    batch_scale: float | None = None,
    reduce_normalizer: Reduce | None = None,
    flat: bool = True,
    prepare: Callable[[nn.Module], nn.Module] | None = None,
    warmup: KernelWarmup | None = None,
) -> StepParts:
    """batch is the global batch (all processes together: accumulation, weight decay and the step count follow
    it); batch_scale the loss multiplier, by default that same global batch (see families/yolo9/loss.py).
    flat=False keeps ordinary parameters (DDP's reducer hooks the registered parameters' gradients). prepare changes
    the train net's modules (SyncBatchNorm) before the flat storage resolves their parameter slots. warmup, if given,
    starts its first pass on a copy of the train net as soon as that is placed (engine/warmup.py)."""
    amp = resolve_amp(cfg.amp, cfg.amp_dtype, device)
    train_net = family.train_net(net, cfg).to(device)
    if prepare is not None:
        train_net = prepare(train_net)
    channels_last = cfg.channels_last and device.type == "cuda"
    if channels_last:
        train_net = train_net.to(memory_format=torch.channels_last)
    batch_scale = float(batch if batch_scale is None else batch_scale)
    if warmup is not None:
        warmup.start(train_net, amp.autocast_dtype, channels_last, batch_scale, keep=net)
    nbs = resolve_nbs(cfg.nbs, batch, n_train, cfg.epochs)
    accumulate = max(round(nbs / batch), 1)
    # optimizer=auto tells long runs from short ones by their optimizer steps at the nominal batch (with nbs=auto
    # a short run steps every batch: counting those would call it long sooner)
    iterations = optimizer_steps(n_train, batch, NOMINAL_BATCH if cfg.nbs == "auto" else nbs, cfg.epochs)
    nc = int(getattr(net, "nc"))  # noqa: B009  (nn.Module types its attributes Tensor | Module)
    name, lr0, momentum = optim.resolve_optimizer(cfg, nc, iterations)
    decay = cfg.weight_decay * batch * accumulate / nbs
    optimizer = optim.build_optimizer(train_net, name, lr0, momentum, decay, device, family.param_groups)
    ema = ModelEMA(net, cfg.ema_decay, cfg.ema_tau) if cfg.ema else None
    flat_params = FlatParams(train_net, amp.autocast_dtype, channels_last) if flat else None
    return StepParts(
        net=net,
        train_net=train_net,
        optimizer=optimizer,
        optimizer_name=name,
        lr0=lr0,
        momentum=momentum,
        scaler=make_scaler(amp),
        ema=ema,
        loss_fn=family.loss(net, cfg, reduce_normalizer),
        amp=amp,
        accumulate=accumulate,
        batch_scale=batch_scale,
        channels_last=channels_last,
        flat=flat_params,
    )
