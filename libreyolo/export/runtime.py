"""An exported file read back: `LibreYOLO("model.onnx")` predicts and validates through onnxruntime (CPU) or
TorchScript with the family's own post-processing. The family's postprocess (and validation's loss) read the
network's structure (strides, head, class count), so the model holds the family's network, built from the metadata
and never run: its forward is the exported graph's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo.errors import ConfigError
from libreyolo.export.meta import ExportMeta, jit_load, need, read_meta
from libreyolo.families import Family, get_family
from libreyolo.families.built import BuiltModel


class GraphForward:
    """The exported graph as the network's forward: float (B, 3, H, W) on any device -> the outputs as float32
    tensors on that device, one tensor or a tuple as the family's network returns them. A graph of fixed batch
    runs the batch in pieces of its size (the last one padded); a graph of fixed size refuses another size."""

    def __init__(self, path: Path, meta: ExportMeta):
        self.path, self.meta = path, meta
        self.dtype = np.float16 if meta.half else np.float32
        if meta.format == "onnx":
            ort = need("onnxruntime", "run an ONNX file")
            self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            self.input = self.session.get_inputs()[0].name
        else:
            self.script = jit_load(path).eval()

    def run(self, x: np.ndarray) -> list[np.ndarray]:
        if self.meta.format == "onnx":
            return list(self.session.run(None, {self.input: x}))
        with torch.no_grad():
            out = self.script(torch.from_numpy(x))
        return [o.numpy() for o in ([out] if isinstance(out, torch.Tensor) else out)]

    def __call__(self, x: torch.Tensor) -> Any:
        self._check_size(x)
        arr = x.detach().cpu().numpy().astype(self.dtype)
        n, step = arr.shape[0], self.meta.batch or arr.shape[0]
        pieces = []
        for start in range(0, n, step):
            chunk = arr[start : start + step]
            real = chunk.shape[0]
            if real < step:
                chunk = np.concatenate((chunk, np.zeros((step - real, *chunk.shape[1:]), self.dtype)))
            outs = self.run(chunk)
            if self.meta.nms:  # packed rows: image index within the piece -> within the batch; padding dropped
                det = outs[0].astype(np.float32)
                det = det[det[:, 0] < real]
                det[:, 0] += start
                outs = [det]
            else:
                outs = [o[:real] for o in outs]
            pieces.append(outs)
        joined = [torch.from_numpy(np.concatenate(p)).float().to(x.device) for p in zip(*pieces)]
        return joined[0] if len(joined) == 1 else tuple(joined)

    def _check_size(self, x: torch.Tensor) -> None:
        s = self.meta.imgsz
        if self.meta.dynamic is not True and tuple(x.shape[2:]) != (s, s):
            raise ConfigError(
                f"{self.path} was exported for {s}x{s} images (dynamic={self.meta.dynamic}), not "
                f"{x.shape[2]}x{x.shape[3]}: use imgsz={s}, or export again with dynamic=true"
            )


class PackedFamily:
    """A family whose graph ends in packed detections (nms=true): the postprocess only applies predict's conf and
    max_det to them; there is no loss (no raw outputs), so validation is refused. Everything else is the family's."""

    def __init__(self, family: Family, path: Path):
        self._family, self._path = family, path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._family, name)

    def postprocess(
        self,
        net: Any,
        raw: torch.Tensor,
        imgsz: Any,
        conf: float = 0.25,
        iou: float = 0.7,
        max_det: int = 300,
        multi_label: bool = False,
    ) -> torch.Tensor:
        raw = raw[raw[:, 5] > conf]
        if len(raw) == 0:
            return raw
        img = raw[:, 0].long()
        first = torch.zeros(int(img.max()) + 1, dtype=torch.long, device=raw.device)
        first.scatter_reduce_(0, img, torch.arange(len(img), device=raw.device), "amin", include_self=False)
        return raw[torch.arange(len(img), device=raw.device) - first[img] < max_det]

    def loss(self, *args: Any, **kwargs: Any) -> Any:
        raise ConfigError(
            f"{self._path} was exported with nms=true: its graph ends in detections, so it has no raw outputs to "
            "validate (losses, conf=0.001). Validate the model exported with nms=false"
        )


def load_exported(model: BuiltModel, path: Path) -> None:
    """Fill a LibreYOLO from an exported file: family, size, classes, image size, metrics, and the network whose
    forward is the graph."""
    meta = read_meta(path)
    try:
        family = get_family(meta.family)
    except KeyError as e:
        raise ConfigError(f"{path} holds a {meta.family!r} model, a family this install does not have") from e
    net = family.build(meta.size, len(meta.names)).eval()
    net.forward = GraphForward(path, meta)  # an instance attribute: nn.Module's call finds it before the class's
    model.family = PackedFamily(family, path) if meta.nms else family
    model.size, model.names, model.imgsz = meta.size, list(meta.names), meta.imgsz
    model.net, model.trained, model.metrics, model.exported = net, True, dict(meta.metrics), meta
