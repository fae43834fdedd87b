"""TorchScript by tracing: the network's ops recorded on an example input, saved with the metadata record as the
archive's extra file libreyolo.json."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from libreyolo.export.meta import KEY


def trace(net: nn.Module, x: torch.Tensor) -> torch.jit.ScriptModule:
    with warnings.catch_warnings():  # the tracer warns per shape-dependent Python value; the check below measures
        warnings.simplefilter("ignore")
        return torch.jit.trace(net, x, check_trace=False, strict=False)


def save(module: torch.jit.ScriptModule, meta_json: str, path: Path) -> None:
    with warnings.catch_warnings():  # torch.jit.save's deprecation (jit_load says why TorchScript still)
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(module, str(path), _extra_files={f"{KEY}.json": meta_json})
