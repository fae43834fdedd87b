"""Turn the `device` setting into a torch.device (or a list of GPUs for the DDP launcher)."""

from __future__ import annotations

import os

import torch

from libreyolo.errors import ConfigError


def parse_device(spec: str) -> tuple[str, list[int]]:
    """-> (kind, gpu indices): ('cpu', []), ('mps', []), ('cuda', [0]), ('cuda', [0, 1]). Checks availability."""
    spec = str(spec).strip().lower()
    if spec == "cpu":
        return "cpu", []
    if spec == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ConfigError("device=mps: Apple MPS is not available on this machine. Use device=cpu.")
        return "mps", []
    if spec in ("auto", ""):
        if torch.cuda.is_available():
            return "cuda", [0]
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return "mps", []
        return "cpu", []
    if spec == "cuda":
        spec = "0"
    ids = [int(x) for x in spec.split(",") if x != ""]
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device={spec}: CUDA is not available (torch {torch.__version__}"
            f"{'' if torch.version.cuda else ', a CPU-only build'}). Use device=cpu, or device=auto to pick what "
            "exists."
        )
    n = torch.cuda.device_count()
    bad = [i for i in ids if i >= n]
    if bad:
        raise ConfigError(f"device={spec}: GPU {bad[0]} does not exist; this machine has {n} GPU(s): 0..{n - 1}.")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"device={spec}: a GPU is listed twice.")
    return "cuda", ids


def first_device(spec: str) -> torch.device:
    """The one device a single-process command (predict, val, bench) runs on: the first GPU `spec` names, or the CPU
    / MPS it names."""
    kind, gpus = parse_device(spec)
    return torch.device(f"cuda:{gpus[0]}" if kind == "cuda" else kind)


def torchrun_env() -> dict[str, int] | None:
    """RANK/LOCAL_RANK/WORLD_SIZE when started by torchrun (or our spawn launcher), else None."""
    if "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return {
            "rank": int(os.environ.get("RANK", 0)),
            "local_rank": int(os.environ["LOCAL_RANK"]),
            "world_size": int(os.environ["WORLD_SIZE"]),
        }
    return None
