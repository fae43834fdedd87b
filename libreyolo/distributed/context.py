"""One training process's place in a distributed run: device, process group, and the few collectives the
trainer needs (all of them torch.distributed's own; nothing here reimplements a collective).

A process is distributed when it was started by torchrun or by our spawn launcher (both set RANK,
LOCAL_RANK and WORLD_SIZE); otherwise `DistContext()` is the single-process no-op, and every method
below costs nothing."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from libreyolo.distributed import elastic
from libreyolo.distributed.device import parse_device, torchrun_env
from libreyolo.errors import ConfigError

# one straggling epoch of validation on rank 0, or a slow first NCCL connect, must not abort the run
PROCESS_GROUP_TIMEOUT = timedelta(hours=3)


@dataclass
class DistContext:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    backend: str | None = None  # None: not distributed
    owns_group: bool = False  # we called init_process_group, so we tear it down
    finished: bool = False

    @property
    def enabled(self) -> bool:
        return self.backend is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # --- collectives (no-ops when not distributed) ---------------------------------------------------
    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (run folder name, validation result, autobatch size)."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def mean(self, values: list[float], device: torch.device) -> list[float]:
        """The mean over ranks of a few floats (epoch losses for results.csv)."""
        if not self.enabled:
            return values
        t = torch.tensor(values, dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return (t / self.world_size).tolist()

    def min(self, value: float, device: torch.device) -> float:
        """The smallest of one float over ranks (the start loss scale every rank can use)."""
        if not self.enabled:
            return value
        t = torch.tensor([value], dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return float(t.item())

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        """Rank 0 runs the block first (dataset generation, label-cache writing); the others then find its results."""
        if not self.is_main:
            self.barrier()
        yield
        if self.is_main:
            self.barrier()

    def normalizer_reducer(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The loss divides by the batch's total target score T, clamped at 1. Dividing instead by
        max(T_global, 1) / world_size, with the loss scaled by the global batch, makes DDP's gradient average
        equal the single-process gradient of the whole global batch (derivation in docs/multi-gpu.md).
        SUM then divide, not AVG: Gloo in older torch releases has no AVG."""
        if not self.enabled or self.world_size == 1:
            return None
        world = self.world_size

        def reduce(normalizer: torch.Tensor) -> torch.Tensor:
            t = normalizer.detach().clone()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            return t.clamp(min=1.0) / world

        return reduce

    def nccl_version(self) -> tuple[int, ...] | None:
        """The NCCL torch was built with, for runs over NCCL (None otherwise)."""
        if self.backend != "nccl":
            return None
        v = torch.cuda.nccl.version()
        return tuple(v) if isinstance(v, tuple) else None

    def grad_reducer(self) -> Callable[[torch.Tensor], None] | None:
        """The gradient average over ranks for steps that keep their gradients in one flat buffer (the CUDA-graph
        runners under DDP, engine/flat.py): one in-place all-reduce of the whole buffer, which NCCL lets a CUDA graph
        capture. DDP's reducer does the same sum-then-divide per bucket, overlapped with the backward. At world size
        1 (torchrun --nproc_per_node=1) the all-reduce still runs, so its cost is measured, and changes nothing."""
        if not self.enabled:
            return None
        world = self.world_size

        def reduce(flat_grad: torch.Tensor) -> None:
            dist.all_reduce(flat_grad, op=dist.ReduceOp.SUM)
            if world > 1:
                flat_grad.div_(world)

        return reduce

    def broadcast_module(self, module: nn.Module) -> None:
        """Rank 0's parameters and buffers on every rank: what DDP's constructor does, for runs without its wrapper."""
        if self.enabled and self.world_size > 1:
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)

    # --- model ---------------------------------------------------------------------------------------
    def wrap(self, train_net: nn.Module, device: torch.device) -> nn.Module:
        """DistributedDataParallel around what the step runs; the trainer keeps the plain module for
        checkpoints and EMA. Every parameter gets a gradient every step (the aux head too), hence no
        find_unused_parameters and its extra graph traversal."""
        if self.world_size == 1:  # also torchrun at world size 1: nothing to average, single-GPU step (flat, graphs)
            return train_net
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [device.index] if device.type == "cuda" else None
        return DDP(train_net, device_ids=ids, output_device=device.index if ids else None, find_unused_parameters=False)

    def seed_rank(self, seed: int) -> None:
        """Ranks above 0 reseed the process-global RNGs (the validation loader's worker base seeds draw from them;
        the training loader has a generator per rank), so no two ranks share a stream. Augmentation itself is
        keyed by (seed, epoch, image index) and the sampler shards images, so it already differs per rank; the
        shuffle seed must stay shared for the shards to be disjoint."""
        if self.enabled and self.rank > 0:
            random.seed(seed + self.rank)
            np.random.seed((seed + self.rank) % 2**32)
            torch.manual_seed(seed + self.rank)

    # --- lifecycle -----------------------------------------------------------------------------------
    def finish(self) -> None:
        """After a run that ended normally: every rank waits until rank 0 has written its last checkpoint."""
        self.barrier()
        self.finished = True

    def close(self) -> None:
        """Tear the process group down after a normal end. After a failure it is left alone: a rank whose peer
        died could block in the teardown, and the process is about to exit (the launcher ends it anyway)."""
        if self.enabled and self.owns_group and self.finished and dist.is_initialized():
            dist.destroy_process_group()
            self.backend = None


def start(device_spec: str) -> tuple[torch.device, DistContext]:
    """The device this process trains on, and its DistContext (joining the process group under torchrun)."""
    env = torchrun_env()
    if env is None:
        kind, gpus = parse_device(device_spec)
        if len(gpus) > 1:
            raise ConfigError(
                f"device={device_spec}: several GPUs need one process each. LibreYOLO.train(...) starts them for you; "
                f"a script that drives the Trainer directly must be started with torchrun --nproc_per_node={len(gpus)}."
            )
        device = torch.device(f"cuda:{gpus[0]}") if kind == "cuda" else torch.device(kind)
        return device, DistContext()
    device = _rank_device(device_spec, env["local_rank"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast: off unless the environment asks for it
    backend = "nccl" if device.type == "cuda" and dist.is_nccl_available() else "gloo"
    owns = not dist.is_initialized()
    if owns:
        kw: dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
        store = elastic.attempt_store(PROCESS_GROUP_TIMEOUT)  # torchrun: keys of this attempt only
        if store is not None:
            kw.update(store=store, rank=env["rank"], world_size=env["world_size"])
        dist.init_process_group(backend, timeout=PROCESS_GROUP_TIMEOUT, **kw)
    else:
        backend = dist.get_backend()
    ctx = DistContext(
        rank=env["rank"],
        local_rank=env["local_rank"],
        world_size=env["world_size"],
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", env["world_size"])),
        backend=backend,
        owns_group=owns,
    )
    return device, ctx


def _rank_device(spec: str, local_rank: int) -> torch.device:
    """Under torchrun each process takes cuda:LOCAL_RANK whatever GPU list `device` names (torchrun, or
    CUDA_VISIBLE_DEVICES set by our launcher, decides which GPUs those are); device=cpu trains on CPU with Gloo."""
    spec = str(spec).strip().lower()
    if spec == "cpu" or (spec in ("auto", "") and not torch.cuda.is_available()):
        return torch.device("cpu")
    if spec == "mps":
        raise ConfigError(
            "device=mps cannot train distributed (no MPS process-group backend); use device=cpu or CUDA GPUs"
        )
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device={spec}: CUDA is not available in this torchrun process; use device=cpu to train on CPU with Gloo"
        )
    n = torch.cuda.device_count()
    if local_rank >= n:
        raise ConfigError(
            f"LOCAL_RANK={local_rank} but this process sees only {n} GPU(s): start torchrun with --nproc_per_node={n} "
            "or fewer"
        )
    return torch.device(f"cuda:{local_rank}")


def split_batch(batch: int, world_size: int) -> int:
    """The per-rank batch of a global `batch`; a remainder would silently change the global batch, so it raises."""
    if batch % world_size:
        lo = max(batch // world_size * world_size, world_size)
        hi = (batch // world_size + 1) * world_size
        options = f"batch={lo} or batch={hi}" if lo != hi else f"batch={hi}"
        raise ConfigError(
            f"batch={batch} is the global batch and must be divisible by world_size={world_size}: each rank\n"
            f"trains at batch // world_size, so this value would silently train at a\n"
            f"different global batch than requested. Use {options}."
        )
    return batch // world_size


def has_batchnorm(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())


def sync_batchnorm(
    train_net: nn.Module, ctx: DistContext, device: torch.device, sync_bn: bool, batch_per_rank: int, notes: list[str]
) -> nn.Module:
    """Convert BatchNorm to SyncBatchNorm when several processes train and it is asked for; warn (once, through
    `notes`) when a BatchNorm model trains on small per-rank batches without it. The converted layers keep the
    Parameter and buffer objects, so an optimizer or EMA built before still points at the live tensors."""
    if ctx.world_size == 1 or not has_batchnorm(train_net):
        return train_net
    if sync_bn and device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(train_net)
    why = (
        "sync_bn=false" if not sync_bn else f"sync_bn has no effect on {device.type} (torch's SyncBatchNorm needs GPUs)"
    )
    if batch_per_rank < 16:
        notes.append(
            f"{why}: BatchNorm statistics come from each rank's own {batch_per_rank} images (batch per rank < 16), "
            f"which can hurt accuracy; set sync_bn=true on GPUs, or raise batch"
        )
    return train_net


def family_message(name: str, device: str, world_size: int) -> str:
    return (
        f"model family {name!r} cannot train distributed (supports_ddp=False), so device={device} with "
        f"{world_size} processes would not split the work. Train on one GPU (device=0); under torchrun, "
        f"start it with --nproc_per_node=1."
    )
