"""The export keys: each once, with its default, parser and help (`libreyolo export --help`, docs/export.md)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from libreyolo import keys as K
from libreyolo.config import unknown_key_message
from libreyolo.errors import ConfigError

FORMATS = ("onnx", "torchscript")


def _opt_imgsz(v: Any) -> int | None:
    return None if K.opt_text(v) is None else K.imgsz(v)


def _opset(v: Any) -> int:
    n = K.integer(v)
    if not 11 <= n <= 23:
        raise ValueError("an ONNX opset from 11 to 23")
    return n


@dataclass(frozen=True)
class ExportOptions:
    format: str = K.option("onnx", K.choice(*FORMATS), "onnx or torchscript", "export")
    imgsz: int | None = K.option(None, _opt_imgsz, "input size (a multiple of 32); default: the checkpoint's", "export")
    batch: int = K.option(1, K.positive(K.integer), "the graph's batch size when dynamic=false", "export")
    dynamic: bool | str = K.option(
        False, K.bool_or("batch"), "false: fixed shape; batch: any batch; true: any batch and image size", "export"
    )
    half: bool = K.option(False, K.boolean, "float16 weights, input and outputs", "export")
    simplify: bool = K.option(False, K.boolean, "onnx: fold constants and drop dead nodes (onnxscript)", "export")
    nms: bool = K.option(False, K.boolean, "onnx, YOLO-style heads: decode and NMS inside the graph", "export")
    conf: float = K.option(0.25, K.fraction, "nms=true: the graph's confidence threshold", "export")
    iou: float = K.option(0.7, K.fraction, "nms=true: the graph's NMS IoU threshold", "export")
    max_det: int = K.option(300, K.positive(K.integer), "nms=true: the most detections per image", "export")
    opset: int = K.option(18, _opset, "onnx: the opset the graph is written in", "export")
    dynamo: bool | str = K.option(
        "auto", K.bool_or("auto"), "onnx: auto (dynamo, else the TorchScript-based exporter), true or false", "export"
    )
    device: str = K.option("cpu", K.device, "where the network is traced", "export")
    file: str | None = K.option(None, K.opt_text, "output path; default: beside the weights, new suffix", "export")
    check: bool = K.option(
        True, K.boolean, "run the exported file on a random input and log its gap to PyTorch", "export"
    )


KEYS = tuple(K.key_list(ExportOptions))


def parse_options(kwargs: dict[str, Any]) -> ExportOptions:
    """Python values or command-line strings -> typed options; an unknown key or a bad value names itself."""
    names = [f.name for f in fields(ExportOptions)]
    out: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key not in names:
            raise ConfigError(unknown_key_message(key, names, "export"))
        parse = next(k.parse for k in KEYS if k.name == key)
        try:
            out[key] = value if value is None and key in ("imgsz", "file") else parse(value)
        except ValueError as e:
            raise ConfigError(f"{key}={value!r} is not valid: {key} takes {e}") from None
    return ExportOptions(**out)
