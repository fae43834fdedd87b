"""batch=-1: pick the global batch from GPU memory.

Probe train-mode forward+backward at a few batch sizes on one device, fit peak memory linearly against
batch, take the largest per-device batch predicted to fit in FRACTION of that device's memory, multiply by
the world size (so the result is always a multiple of it), and cap at `nbs` rounded down to a world-size
multiple: with more GPUs the run accumulates fewer steps instead of shrinking each GPU's batch.

Who probes: the spawn launcher's parent before any worker exists; under torchrun rank 0, which broadcasts
the integer; on one GPU the training process itself. CPU and MPS keep the default (one line says so)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from libreyolo.engine.components import NOMINAL_BATCH
from libreyolo.families.base import LossFn

if TYPE_CHECKING:
    from libreyolo.config import TrainConfig
    from libreyolo.distributed.context import DistContext
    from libreyolo.families import Family

FRACTION = 0.6
PROBE_SIZES = (1, 2, 4, 8, 16)
DEFAULT_BATCH = 16
MAX_BATCH = 1024


def fit_batch(
    samples: list[tuple[int, float]],
    budget_bytes: float,
    world_size: int = 1,
    nbs: int | None = None,
    oom_at: int | None = None,
) -> tuple[int, int]:
    """-> (global batch, per-device batch before the nbs cap) from (batch, peak bytes) probe samples."""
    if not samples:
        raise ValueError("autobatch needs at least one probe sample (the smallest batch did not fit)")
    b = np.array([s[0] for s in samples], dtype=np.float64)
    mem = np.array([s[1] for s in samples], dtype=np.float64)
    if len(samples) >= 2 and np.ptp(b) > 0:
        slope, intercept = np.polyfit(b, mem, 1)
    else:  # one point: assume memory proportional to batch
        slope, intercept = mem[0] / b[0], 0.0
    # the epsilon keeps an exact fit (94.0 computed as 93.99999...) from losing an image to rounding
    per_device = MAX_BATCH if slope <= 0 else int(math.floor((budget_bytes - intercept) / slope + 1e-6))
    if oom_at is not None:
        per_device = min(per_device, oom_at - 1)
    per_device = int(min(max(per_device, 1), MAX_BATCH))
    global_batch = per_device * world_size
    if nbs is not None and nbs > 0:
        global_batch = min(global_batch, max(nbs // world_size * world_size, world_size))
    return global_batch, per_device


def default_batch(world_size: int) -> int:
    """CPU/MPS: the default batch, made a multiple of the world size so it divides."""
    return max(DEFAULT_BATCH // world_size * world_size, world_size)


def probe_memory(
    train_net: nn.Module,
    loss_fn: LossFn,
    device: torch.device,
    imgsz: int,
    autocast_dtype: torch.dtype | None,
    channels_last: bool = False,
    sizes: tuple[int, ...] = PROBE_SIZES,
) -> tuple[list[tuple[int, float]], int | None]:
    """Peak allocated bytes of one train-mode forward+backward at each size; stops at the first OOM (returned).

    BatchNorm buffers are put back afterwards: random probe images must not shift a pretrained model's statistics."""
    saved = {k: v.detach().clone() for k, v in train_net.named_buffers()}
    was_training = train_net.training
    train_net.train()
    samples: list[tuple[int, float]] = []
    oom_at = None
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    for b in sizes:
        try:
            samples.append((b, _peak_bytes(train_net, loss_fn, device, b, imgsz, autocast_dtype, fmt)))
        except torch.cuda.OutOfMemoryError:
            oom_at = b
            break
        finally:
            train_net.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()
    with torch.no_grad():
        for k, v in train_net.named_buffers():
            v.copy_(saved[k])
    train_net.train(was_training)
    return samples, oom_at


def autobatch(
    train_net: nn.Module,
    loss_fn: LossFn,
    device: torch.device,
    imgsz: int,
    autocast_dtype: torch.dtype | None,
    world_size: int = 1,
    nbs: int | None = None,
    channels_last: bool = False,
) -> tuple[int, str]:
    """-> (global batch, one line saying how it was chosen). CUDA only."""
    samples, oom_at = probe_memory(train_net, loss_fn, device, imgsz, autocast_dtype, channels_last)
    total = torch.cuda.get_device_properties(device).total_memory
    global_batch, per_device = fit_batch(samples, FRACTION * total, world_size, nbs, oom_at)
    b = [s[0] for s in samples]
    capped = f", capped at nbs={nbs}" if global_batch < per_device * world_size else ""
    line = (
        f"autobatch: batch={global_batch} ({global_batch // world_size} per GPU x {world_size}) from train-step memory "
        "at "
        f"batch {b[0]}..{b[-1]} on {torch.cuda.get_device_name(device)}: largest per-GPU batch within "
        f"{FRACTION:.0%} of {total / 2**30:.0f} GiB is {per_device}{capped}"
    )
    return global_batch, line


def _peak_bytes(
    train_net: nn.Module,
    loss_fn: LossFn,
    device: torch.device,
    b: int,
    imgsz: int,
    autocast_dtype: torch.dtype | None,
    fmt: torch.memory_format,
) -> float:
    """Peak allocated bytes of one forward+backward at batch b; its tensors are freed when it returns."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    x = torch.rand(b, 3, imgsz, imgsz, device=device).contiguous(memory_format=fmt)
    targets, mask = _synthetic_targets(b, imgsz, device)
    with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
        outputs = train_net(x)
    loss, _ = loss_fn(outputs, targets, mask, (imgsz, imgsz), float(b))
    loss.backward()
    torch.cuda.synchronize(device)
    return float(torch.cuda.max_memory_allocated(device))


def probe_model(family: Family, size: str, nc: int, cfg: TrainConfig, device: torch.device) -> tuple[nn.Module, LossFn]:
    """A throwaway copy of the network the run will train, to probe (the real one's weights stay untouched)."""
    net = family.build(size, nc)
    train_net = family.train_net(net, cfg).to(device)
    if cfg.channels_last:
        train_net = train_net.to(memory_format=torch.channels_last)
    return train_net, family.loss(net, cfg)


def _synthetic_targets(
    b: int, imgsz: int, device: torch.device, per_image: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    """Class-0 boxes spread over the image: the assigner's memory grows with the number of targets."""
    k = torch.arange(per_image, device=device, dtype=torch.float32)
    side = imgsz / 4
    x1 = (k % 4) * side
    y1 = (k // 4 % 4) * side
    boxes = torch.stack((torch.zeros_like(k), x1, y1, x1 + side * 0.8, y1 + side * 0.8), -1)
    return boxes.expand(b, per_image, 5).contiguous(), torch.ones(b, per_image, dtype=torch.bool, device=device)


def resolve_global_batch(
    cfg: TrainConfig,
    device: torch.device,
    ctx: DistContext,
    probe: Callable[[], tuple[nn.Module, LossFn]],
    autocast_dtype: torch.dtype | None,
    notes: list[str],
) -> int:
    """cfg.batch, or for batch=-1 the autobatch result (rank 0 probes; every rank gets the same integer)."""
    if cfg.batch != -1:
        return int(cfg.batch)
    if device.type != "cuda":
        b = default_batch(ctx.world_size)
        notes.append(f"batch=-1 (autobatch) needs a CUDA device; using batch={b} on {device.type}")
        return b
    result = None
    if ctx.is_main:
        train_net, loss_fn = probe()
        cap = NOMINAL_BATCH if cfg.nbs == "auto" else int(cfg.nbs)
        result = autobatch(
            train_net, loss_fn, device, cfg.imgsz, autocast_dtype, ctx.world_size, cap, cfg.channels_last
        )
    b, line = ctx.broadcast(result)
    notes.append(line)
    return b
