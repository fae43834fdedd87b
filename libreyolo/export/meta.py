"""The metadata record an exported file carries (ONNX: metadata_props["libreyolo"]; TorchScript: the extra file
libreyolo.json): enough for `LibreYOLO("model.onnx")` to rebuild the post-processing and for anyone to know what
the graph takes and returns."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from libreyolo.errors import CheckpointError, ConfigError

SUFFIXES = {".onnx": "onnx", ".torchscript": "torchscript"}
KEY = "libreyolo"  # the ONNX metadata key, and the TorchScript extra file's stem
SCHEMA = 1
INPUT = (
    "images: float (B, 3, H, W), RGB in [0, 1]; letterboxed (detect) or short-side resized and centre-cropped "
    "(classify)"
)


@dataclass
class ExportMeta:
    format: str
    family: str
    size: str
    task: str
    names: list[str]
    imgsz: int
    stride: int
    batch: int | None  # None: any batch
    dynamic: bool | str  # false, "batch" or true (any batch and image size)
    half: bool
    outputs: list[str]
    meaning: str
    exporter: str  # "dynamo", "torchscript-based" (ONNX) or "trace" (TorchScript)
    opset: int | None
    version: str
    torch: str
    nms: dict[str, float] | None = None  # nms=true: the graph's conf, iou and max_det
    input: str = INPUT
    metrics: dict[str, float] = field(default_factory=dict)
    source: str = ""
    schema: int = SCHEMA

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, path: Path) -> ExportMeta:
        try:
            record = json.loads(text)
            return cls(**record)
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"{path}: its libreyolo metadata cannot be read ({e}); export the model again") from e


def read_meta(path: Path) -> ExportMeta:
    """The record of an exported file; a file without one (exported by another tool) is an error naming it."""
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    kind = SUFFIXES.get(path.suffix)
    text: Any = None
    if kind == "onnx":
        onnx = need("onnx", "read an .onnx file")
        model = onnx.load(str(path), load_external_data=False)
        text = next((p.value for p in model.metadata_props if p.key == KEY), None)
    elif kind == "torchscript":
        extra = {f"{KEY}.json": ""}
        try:
            jit_load(path, _extra_files=extra)
        except RuntimeError as e:
            raise CheckpointError(f"{path} is not a TorchScript archive torch can read: {e}") from e
        text = extra[f"{KEY}.json"] or None
    if not text:
        raise CheckpointError(
            f"{path} has no libreyolo metadata: only files written by `libreyolo export` can be loaded (they record "
            "the family, classes and image size the post-processing needs)"
        )
    return ExportMeta.from_json(text, path)


def jit_load(path: Path, _extra_files: dict[str, str] | None = None) -> Any:
    """torch.jit.load on the CPU, without its deprecation warning (torch points at torch.export, whose archives
    have no loader outside Python as TorchScript's C++ one)."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return torch.jit.load(str(path), map_location="cpu", _extra_files=_extra_files)


def need(module: str, why: str) -> Any:
    """Import an optional dependency of the `export` extra, or say how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"to {why}, libreyolo needs the package {module!r}: pip install 'libreyolo[export]' "
            "(onnx, onnxruntime, onnxscript)"
        ) from None
