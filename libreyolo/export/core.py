"""`LibreYOLO.export(...)` / `libreyolo export`: the options checked against what the family's graph can be, the
graph traced and written whole beside the weights with its metadata, then run on a random input and compared with
PyTorch."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from libreyolo.atomic import written_whole
from libreyolo.errors import ConfigError
from libreyolo.export import onnx as onnx_export
from libreyolo.export import torchscript
from libreyolo.export.graph import NmsGraph, as_list
from libreyolo.export.meta import ExportMeta, jit_load
from libreyolo.export.options import ExportOptions, parse_options
from libreyolo.families.base import ExportSpec
from libreyolo.families.built import BuiltModel

SUFFIX = {"onnx": ".onnx", "torchscript": ".torchscript"}


def refuse(model: BuiltModel, spec: ExportSpec, opts: ExportOptions) -> None:
    """What cannot be exported is an error before anything is traced or written."""
    name = model.model_name
    if opts.nms and spec.boxes_scores is None:
        raise ConfigError(
            f"nms=true puts a YOLO-style head's decode and NMS in the graph; {name} (task {model.family.task}) has "
            "no NMS to put there: export it with nms=false"
        )
    if opts.nms and opts.format != "onnx":
        raise ConfigError("nms=true is for format=onnx; a TorchScript export holds the network's raw outputs")
    if opts.nms and opts.dynamic is not False:
        raise ConfigError(f"nms=true makes a graph for one input shape; export with dynamic=false (not {opts.dynamic})")
    if opts.dynamic is True and spec.fixed_size:
        raise ConfigError(
            f"{name} cannot be exported with dynamic=true (any image size): {spec.fixed_size}. Export with "
            "dynamic=batch (any batch, one image size) or dynamic=false, at the imgsz= you will run"
        )
    if opts.simplify and opts.format != "onnx":
        raise ConfigError("simplify=true is for format=onnx")


def default_path(model: BuiltModel, fmt: str) -> Path:
    """Beside the weights the model was loaded from, or those its last training run left (best.pt); a model
    built from a name alone: in the working folder, under its name."""
    src = Path(model.source)
    run = getattr(model, "last_run", None)
    if not src.is_file() and run is not None and (Path(run) / "weights" / "best.pt").is_file():
        src = Path(run) / "weights" / "best.pt"
    return src.with_suffix(SUFFIX[fmt]) if src.is_file() else Path(f"{model.model_name}{SUFFIX[fmt]}")


def export_model(model: BuiltModel, log: Callable[[str], None] = print, **kwargs: Any) -> Path:
    """-> the exported file's path. kwargs: the export keys (options.py)."""
    opts = parse_options(kwargs)
    if getattr(model, "exported", None) is not None:
        raise ConfigError(f"{model.source} is already an exported graph: export from the .pt weights")
    spec: ExportSpec | None = model.family.export_spec()
    spec = spec or ExportSpec(outputs=(), meaning="the network's eval-mode outputs")
    refuse(model, spec, opts)
    imgsz = opts.imgsz or model.imgsz
    dtype = torch.float16 if opts.half else torch.float32
    from libreyolo.distributed.device import first_device

    device = first_device(opts.device)
    net: nn.Module = copy.deepcopy(model.net).eval().to(device, dtype)
    module = net
    if opts.nms:
        assert spec.boxes_scores is not None
        module = NmsGraph(net, spec.boxes_scores, opts.conf, opts.iou, opts.max_det).eval()
    x = _example(opts.batch, imgsz, dtype, device, 0)
    with torch.no_grad():
        try:
            n_out = len(as_list(module(x)))
        except RuntimeError as e:
            if not opts.half:
                raise
            raise ConfigError(f"{model.model_name} does not run in float16 ({e}); export with half=false") from e
    outputs = ["detections"] if opts.nms else list(spec.outputs) or [f"output{i}" for i in range(n_out)]
    path = Path(opts.file) if opts.file else default_path(model, opts.format)
    meta = ExportMeta(
        format=opts.format,
        family=model.family.name,
        size=model.size,
        task=model.family.task,
        names=list(model.names),
        imgsz=imgsz,
        stride=max(getattr(net, "strides", (32,))),
        batch=None if opts.dynamic is not False else opts.batch,
        dynamic=opts.dynamic,
        half=opts.half,
        outputs=outputs,
        exporter="trace",
        opset=None,
        version=_version(),
        torch=torch.__version__,
        meaning="packed detections (N, 7): image index in the batch, x1, y1, x2, y2 (input pixels), score, class"
        if opts.nms
        else spec.meaning,
        nms={"conf": opts.conf, "iou": opts.iou, "max_det": opts.max_det} if opts.nms else None,
        metrics=dict(getattr(model, "metrics", {}) or {}),
        source=Path(model.source).name,
    )
    with written_whole(path) as tmp:
        if opts.format == "onnx":
            proto, meta.exporter = onnx_export.export_onnx(module, x, opts, outputs, log)
            meta.opset = opts.opset
            onnx_export.finish(proto, meta.to_json(), opts.simplify, tmp)
        else:
            torchscript.save(torchscript.trace(module, x), meta.to_json(), tmp)
        gaps = _check(module, tmp, opts, x) if opts.check else None
    shape = "any batch" if meta.batch is None else f"batch {meta.batch}"
    shape += ", any image size" if opts.dynamic is True else f", {imgsz}x{imgsz}"
    nms = f", nms conf={opts.conf} iou={opts.iou} max_det={opts.max_det}" if opts.nms else ""
    opset = f", opset {meta.opset}" if meta.opset else ""
    log(
        f"exported {model.model_name} to {path} ({path.stat().st_size / 1e6:.1f} MB): {opts.format} by the "
        f"{meta.exporter} exporter{opset}, {shape}, {'float16' if opts.half else 'float32'}{nms}; outputs "
        f"{', '.join(outputs)}"
    )
    if gaps:
        log("checked against PyTorch: " + "; ".join(gaps))
    return path


def _example(batch: int, imgsz: int, dtype: torch.dtype, device: torch.device, seed: int, extra: int = 0) -> Any:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(batch, 3, imgsz + extra, imgsz + extra, generator=g).to(device, dtype)


def _check(module: nn.Module, path: Path, opts: ExportOptions, x: torch.Tensor) -> list[str]:
    """Run the written file on the export's input (and, for a dynamic graph, on another batch and size) beside the
    PyTorch module: the largest absolute gap per input. A gap is measured, not judged: float16 differs by design."""
    inputs = [x]
    if opts.dynamic is not False:
        inputs.append(_example(x.shape[0] + 1, x.shape[2], x.dtype, x.device, 1, 32 if opts.dynamic is True else 0))
    ts = jit_load(path).to(x.device) if opts.format == "torchscript" else None
    lines = []
    for inp in inputs:
        with torch.no_grad():
            want = as_list(module(inp))
            got = onnx_export.run_onnx(path, inp) if ts is None else as_list(ts(inp))
        where = "onnxruntime CPU" if ts is None else "TorchScript"
        shape = "x".join(str(d) for d in inp.shape)
        if [tuple(w.shape) for w in want] != [tuple(g.shape) for g in got]:
            raise ConfigError(
                f"the exported graph's outputs on a {shape} input have shapes {[tuple(g.shape) for g in got]}, "
                f"PyTorch's {[tuple(w.shape) for w in want]}: the graph does not hold for this shape; export with "
                "dynamic=false"
            )
        gap = max(
            (float((w.float().cpu() - g.float().cpu()).abs().max()) if w.numel() else 0.0) for w, g in zip(want, got)
        )
        lines.append(f"{where} on a random {shape} input, max |output difference| {gap:.2e}")
    return lines


def _version() -> str:
    from libreyolo import __version__

    return __version__
