"""Model families: each is a Family spec; the registry maps model names to (family, size)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn


@dataclass(frozen=True)
class Family:
    """What the one training loop needs to know about a model family."""

    name: str
    prefix: str  # model names are prefix + size, e.g. LibreYOLO9 + t
    sizes: tuple[str, ...]
    task: str
    build: Callable[[str, int], nn.Module]  # (size, num_classes) -> network, random init
    train_net: Callable[[nn.Module, Any], nn.Module]  # (network, TrainConfig) -> what the step runs
    loss: Callable[[nn.Module, Any, Callable | None], Callable]  # (network, cfg, normalizer reduce) -> loss fn
    postprocess: Callable[..., list[dict[str, torch.Tensor]]]  # raw output -> per-image detections
    # which part the CUDA-graph manager may capture: "network" (the whole TrainNet) or "" for none
    capture_plan: str = "network"
    supports_full_graph: bool = False
    supports_ddp: bool = True
    defaults: dict[str, Any] = field(default_factory=dict)
    hooks: dict[str, Callable] = field(default_factory=dict)  # e.g. on_mosaic_close(trainer)


_REGISTRY: dict[str, Family] = {}


def register(family: Family) -> Family:
    _REGISTRY[family.name] = family
    return family


def families() -> dict[str, Family]:
    _load_builtin()
    return dict(_REGISTRY)


def get_family(name: str) -> Family:
    _load_builtin()
    if name not in _REGISTRY:
        raise KeyError(f"unknown family {name!r}; known: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def parse_model_name(name: str) -> tuple[Family, str] | None:
    """'LibreYOLO9t' -> (yolo9 family, 't'); None if the name is not a known model name."""
    _load_builtin()
    for fam in _REGISTRY.values():
        m = re.fullmatch(re.escape(fam.prefix) + r"([a-z]+)", name, flags=re.IGNORECASE)
        if m and m.group(1).lower() in fam.sizes:
            return fam, m.group(1).lower()
    return None


def model_names() -> list[str]:
    _load_builtin()
    return [f.prefix + s for f in _REGISTRY.values() for s in f.sizes]


def _load_builtin() -> None:
    if not _REGISTRY:
        from libreyolo.families import yolo9  # noqa: F401  (registers itself)
