"""The ONNX graph from torch's exporter: the dynamo exporter (torch.export) where it works, the TorchScript-based
one where it does not, and which one made the file is said in the log and the metadata."""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from libreyolo.errors import ConfigError
from libreyolo.export.meta import KEY, need
from libreyolo.export.options import ExportOptions

INPUT = "images"


def _dims(dynamic: bool | str) -> list[int]:
    """The input's dynamic dimensions: none, the batch, or the batch and the image's height and width."""
    return [] if dynamic is False else [0] if dynamic == "batch" else [0, 2, 3]


def _dynamo(net: nn.Module, x: torch.Tensor, opts: ExportOptions, outputs: list[str]) -> Any:
    dims = _dims(opts.dynamic)
    shapes = None
    if dims:
        d: dict[int, Any] = {0: torch.export.Dim("batch", min=1, max=4096)}
        if 2 in dims:
            d[2] = 32 * torch.export.Dim("h32", min=1, max=512)
            d[3] = 32 * torch.export.Dim("w32", min=1, max=512)
        shapes = (d,)
    program = torch.onnx.export(
        net,
        (x,),
        dynamo=True,
        opset_version=opts.opset,
        input_names=[INPUT],
        output_names=outputs,
        dynamic_shapes=shapes,
        optimize=True,
        verbose=False,
    )
    model = program.model_proto
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset != opts.opset:  # its version converter gives up on some graphs and leaves them at its own opset
        raise RuntimeError(f"it wrote opset {opset}, not opset={opts.opset}")
    fixed = [i for i in dims if model.graph.input[0].type.tensor_type.shape.dim[i].dim_param == ""]
    if fixed:  # torch.export specialised a dimension the graph was asked to leave free
        raise RuntimeError(f"torch.export fixed input dimension(s) {fixed} that dynamic={opts.dynamic} leaves free")
    return model


def _torchscript_based(net: nn.Module, x: torch.Tensor, opts: ExportOptions, outputs: list[str]) -> Any:
    onnx = need("onnx", "export to ONNX")
    names = {0: "batch", 2: "height", 3: "width"}
    axes = {INPUT: {i: names[i] for i in _dims(opts.dynamic)}} if opts.dynamic is not False else None
    if axes is not None:
        for o in outputs:  # every output's first dimension follows the batch (packed detections: the count)
            axes[o] = {0: f"{o}_0"}
    buf = io.BytesIO()
    torch.onnx.export(
        net,
        (x,),
        buf,
        dynamo=False,
        opset_version=opts.opset,
        input_names=[INPUT],
        output_names=outputs,
        dynamic_axes=axes,
        do_constant_folding=True,
    )
    return onnx.load_from_string(buf.getvalue())


def export_onnx(
    net: nn.Module, x: torch.Tensor, opts: ExportOptions, outputs: list[str], log: Callable[[str], None]
) -> tuple[Any, str]:
    """-> (the ONNX ModelProto, the exporter that made it). dynamo=auto tries the dynamo exporter and, when it
    fails, says why in one line and uses the TorchScript-based exporter."""
    need("onnx", "export to ONNX")
    need("onnxscript", "export to ONNX")  # torch's dynamo exporter translates through it
    if opts.dynamo is not False:
        try:
            with _quiet():
                return _dynamo(net, x, opts, outputs), "dynamo"
        except Exception as e:  # torch.export's and the translator's failures have no common type
            why = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
            if opts.dynamo is True:
                raise ConfigError(f"the dynamo exporter failed ({why}); export with dynamo=auto or dynamo=false") from e
            log(f"the dynamo exporter failed ({type(e).__name__}: {why[:300]}); using the TorchScript-based exporter")
    with _quiet():
        return _torchscript_based(net, x, opts, outputs), "torchscript-based"


@contextlib.contextmanager
def _quiet() -> Any:
    """torch's exporters print progress and warn per traced op: the log says what matters in one line."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def finish(model: Any, meta_json: str, simplify: bool, path: Path) -> None:
    """Simplify (onnxscript's optimizer: constant folding, dead nodes), record the metadata, check and write."""
    onnx = need("onnx", "export to ONNX")
    if simplify:
        from onnxscript import optimizer

        with _quiet():
            model = optimizer.optimize(model)
    del model.metadata_props[:]
    entry = model.metadata_props.add()
    entry.key, entry.value = KEY, meta_json
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def run_onnx(path: Path, x: torch.Tensor) -> list[torch.Tensor]:
    """The file run by onnxruntime on CPU: the outputs as torch tensors."""
    ort = need("onnxruntime", "run an ONNX file")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [torch.from_numpy(o) for o in session.run(None, {session.get_inputs()[0].name: x.cpu().numpy()})]
