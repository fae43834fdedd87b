"""Reading a weights file without running code from it: torch.load(weights_only=True) or safetensors; the file's
tensors (a flat name -> tensor dict, wherever in the file they are) and its other top-level fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from libreyolo.engine.checkpoint import load_torch_file
from libreyolo.errors import CheckpointError

# where a checkpoint keeps its network's tensors, the preferred first: an EMA's (RT-DETR's releases keep both)
TENSOR_PLACES = (("ema", "module"), ("model",), ("state_dict",), ("module",))


def _flat(obj: Any) -> bool:
    return isinstance(obj, dict) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def read_file(path: Path, known: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """-> (tensors, the other top-level fields). known: the known formats, for the error naming them."""
    if path.suffix == ".safetensors":
        return _safetensors(path, known)
    yaml_hint = " (a dataset yaml goes to data=)" if path.suffix in (".yaml", ".yml") else ""
    obj = load_torch_file(
        path,
        f"is not a libreyolo checkpoint: it is not a PyTorch file, nor safetensors{yaml_hint}. Known formats: {known}",
        "holds Python objects: loading it would execute code stored in the file (pickle), which libreyolo refuses to "
        f"do; save its state_dict alone (torch.save(model.state_dict(), path)). Known formats: {known}",
    )
    if _flat(obj):
        return obj, {}
    if isinstance(obj, dict):
        for place in TENSOR_PLACES:
            found: Any = obj
            for k in place:
                found = found.get(k) if isinstance(found, dict) else None
            if _flat(found):
                return found, {k: v for k, v in obj.items() if not isinstance(v, dict) or k == "names"}
    raise CheckpointError(f"{path} holds no weights where a checkpoint keeps them. Known formats: {known}")


def _safetensors(path: Path, known: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError:
        raise CheckpointError(f'{path}: reading .safetensors needs pip install "libreyolo[weights]"') from None
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path} is not a readable safetensors file ({e}). Known formats: {known}") from None
