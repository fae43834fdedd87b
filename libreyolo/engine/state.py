"""What a checkpoint holds, and putting it back: weights for inference, plus the full train state in last.pt."""

from __future__ import annotations

import random
import time
from typing import Any

import numpy as np
import torch

from libreyolo.engine.checkpoint import FORMAT, load_weights
from libreyolo.engine.ema import ModelEMA
from libreyolo.engine.step import TrainCounters


def model_record(
    family: str,
    size: str,
    names: list[str],
    weights: dict[str, torch.Tensor],
    imgsz: int,
    args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The part every checkpoint has: enough to rebuild the network and run it. The weights are taken as they
    are (snapshot() copies them off the device)."""
    from libreyolo import __version__

    return {
        "format": FORMAT,
        "version": __version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "family": family,
        "size": size,
        "nc": len(names),
        "names": list(names),
        "imgsz": imgsz,
        "model": dict(weights),
        "train_args": dict(args or {}),
    }


def train_state(
    net: torch.nn.Module,
    counters: TrainCounters,
    optimizer_name: str,
    scaler: torch.amp.GradScaler,
    ema: ModelEMA | None,
    ema_is_model: bool,
    run_dir: str,
    bad_files: set[str],
) -> dict[str, Any]:
    """last.pt's train state beside its model record, with no value read off the device (the snapshot copies the
    tensors behind the queued steps). counters: the step runner's (StepRunner.train_counters). ema_is_model: the
    record's weights are the EMA's, so the EMA is stored once (its update count only)."""
    if ema is None:
        ema_state = None
    else:
        ema_state = (
            {"updates": counters.ema_updates} if ema_is_model else {**ema.state_dict(), "updates": counters.ema_updates}
        )
    return {
        "net": net.state_dict(),
        "optimizer": counters.optimizer,
        "optimizer_name": optimizer_name,
        "scaler": scaler_state(scaler),
        "ema": ema_state,
        "rng": rng_state(),
        "run_dir": run_dir,
        "bad_files": sorted(bad_files),
    }


def scaler_state(scaler: torch.amp.GradScaler) -> dict[str, Any]:
    """GradScaler.state_dict() without its two reads of the device (the scale and the growth tracker, each a wait for
    every queued step): an enabled scaler's two tensors stay tensors, which restore_train_state turns back into
    numbers. A scaler that has not scaled yet has no tensors: its own state_dict() reads nothing then."""
    if not scaler.is_enabled() or scaler._scale is None or scaler._growth_tracker is None:
        return scaler.state_dict()
    scale, tracker = scaler._scale, scaler._growth_tracker
    return {
        "scale": scale,
        "growth_factor": scaler._growth_factor,
        "backoff_factor": scaler._backoff_factor,
        "growth_interval": scaler._growth_interval,
        "_growth_tracker": tracker,
    }


def restore_train_state(
    ckpt: dict[str, Any], net: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: Any, ema: ModelEMA | None
) -> None:
    """Puts a last.pt's train state (train_state above) back into the run's network, optimizer, scaler and EMA. The
    random generators are the caller's to restore (restore_rng), after anything that may still draw."""
    tr = ckpt["train"]
    load_weights(net, tr["net"], "last.pt train state")
    optimizer.load_state_dict(tr["optimizer"])
    scaler.load_state_dict({k: v.item() if isinstance(v, torch.Tensor) else v for k, v in tr["scaler"].items()})
    if ema is not None and tr["ema"] is not None:
        ema.load_state_dict({"ema": ckpt["model"], **tr["ema"]})  # unless the train state has its own copy


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state(legacy=True)
    assert isinstance(np_state, tuple)  # legacy=True: the (name, keys, pos, has_gauss, gauss) tuple
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else [],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "python": random.getstate(),
    }


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


# cudnn_benchmark=auto turns cuDNN's algorithm timing on only for runs this long. Measured on the H200
# (docs/performance.md): the timing costs ~24 s of a run (first step, first validation) and saves 0-10% of
# a step (LibreYOLO9t batch 16 full graph: 0; eager 8.6 ms; batch 64 full 6.9 ms): it pays off after
# ~3,500 steps.
CUDNN_BENCHMARK_MIN_STEPS = 5000


def cudnn_benchmark_for(setting: bool | str, deterministic: bool, steps: int) -> bool:
    if deterministic:
        return False
    return steps >= CUDNN_BENCHMARK_MIN_STEPS if setting == "auto" else bool(setting)


def seed_everything(seed: int, deterministic: bool) -> None:
    """Seeds every generator; cuDNN's algorithm timing starts off (setup turns it on via cudnn_benchmark_for
    once the run's length is known)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
