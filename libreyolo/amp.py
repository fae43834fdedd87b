"""Mixed-precision policy: which autocast dtype (if any) and whether a loss scaler runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from libreyolo.errors import ConfigError

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class AmpPolicy:
    enabled: bool
    dtype: str  # float16 | bfloat16 | float32
    scaler: bool  # dynamic loss scaling (float16 only: bfloat16 has float32's exponent range)
    reason: str

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return DTYPES.get(self.dtype) if self.enabled else None


def resolve_amp(
    amp: bool, amp_dtype: str, device: torch.device, bf16_supported: Callable[[], bool] | None = None
) -> AmpPolicy:
    """Decide AMP at setup, before any work; an impossible request raises here rather than mid-run."""
    if not amp:
        return AmpPolicy(False, "float32", False, "amp off (amp=false): float32 training")
    if device.type != "cuda":
        return AmpPolicy(
            False, "float32", False, f"amp off on {device.type}: mixed precision runs on CUDA only, training in float32"
        )
    if amp_dtype == "bfloat16":
        supported = (bf16_supported or torch.cuda.is_bf16_supported)()
        if not supported:
            raise ConfigError(
                "amp_dtype='bfloat16' requires a CUDA device with BF16 support (Ampere or newer); use amp_dtype=float16"
            )
        return AmpPolicy(True, "bfloat16", False, "amp on: bfloat16 autocast, no loss scaler needed")
    return AmpPolicy(True, "float16", True, "amp on: float16 autocast with dynamic loss scaling")


def make_scaler(policy: AmpPolicy) -> torch.amp.GradScaler:
    return torch.amp.GradScaler("cuda", enabled=policy.scaler)
