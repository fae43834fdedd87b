"""A process's first training pass, with and without a thread that runs its convolutions and BatchNorms first.

    python benchmarks/conv_prewarm.py plain|beside|before [--model LibreYOLO9t] [--batch 16] [--imgsz 640]

An experiment (needs a CUDA GPU; run each mode in a fresh process). A process's first forward and backward take
~0.8 s each on the H200 against ~0.05 s warm, most of it cuDNN's first calls per convolution shape
(docs/performance.md); the kernels a call loads are the process's, its execution plans the calling thread's
(autograd runs every backward on one device thread). Here the convolutions' and BatchNorms' shapes are read off a
forward of the train net on the meta device (no kernels), then a helper thread runs each of them on random float16
channels-last tensors, forward and backward through autograd, from the last layer back:
- plain: no helper;
- beside: the helper starts as the main thread's first forward does (the two meet in the middle);
- before: the helper runs to its end first (what the first pass costs once everything it can warm is warm).
Prints the marks (seconds since launch) and one JSON line: first_pass_s from the net on the GPU to the end of the
first backward, helper_s the helper's own time."""

from __future__ import annotations

import argparse
import copy
import json
import threading
import time
from collections.abc import Callable

T0 = time.perf_counter()
import torch  # noqa: E402  (timed)
import torch.nn.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from libreyolo.bench.step import _batch_on_device  # noqa: E402
from libreyolo.config import TrainConfig  # noqa: E402
from libreyolo.engine.step import feed_targets, normalize, train_forward  # noqa: E402
from libreyolo.families import parse_model_name  # noqa: E402

aten = torch.ops.aten


class Record(TorchDispatchMode):
    """The convolutions' arguments and the BatchNorms' input shapes of a forward, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.convs: list[tuple] = []
        self.bns: list[tuple[tuple[int, ...], bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is aten.convolution.default:
            x, w, b, stride, padding, dilation, transposed, out_pad, groups = args
            self.convs.append(
                (tuple(x.shape), tuple(w.shape), b is not None, tuple(stride), tuple(padding), tuple(dilation), groups)
            )
        elif "batch_norm" in func.__name__ and args and isinstance(args[0], torch.Tensor):
            self.bns.append((tuple(args[0].shape), True))
        return func(*args, **kwargs)


def shapes(train: torch.nn.Module, img: torch.Tensor) -> Record:
    meta = copy.deepcopy(train).to("meta")
    rec = Record()
    with rec:
        x = torch.empty(img.shape, dtype=torch.uint8, device="meta")
        meta(normalize(x, True))
    return rec


Make = Callable[..., torch.Tensor]  # torch.randn's signature: (shape, device=, dtype=) -> tensor


def conv_once(key: tuple, dev: torch.device, dtype: torch.dtype, fmt: torch.memory_format, make: Make) -> None:
    """One recorded convolution (Record's convs entry), forward and backward through autograd, on make's tensors."""
    x_shape, w_shape, bias, stride, padding, dilation, groups = key
    x = make(x_shape, device=dev, dtype=dtype).contiguous(memory_format=fmt).requires_grad_()
    w = make(w_shape, device=dev, dtype=dtype).contiguous(memory_format=fmt).requires_grad_()
    b = make((w_shape[0],), device=dev, dtype=dtype).requires_grad_() if bias else None
    y = F.conv2d(x, w, b, stride, padding, dilation, groups)
    y.backward(make(y.shape, device=dev, dtype=y.dtype).contiguous(memory_format=fmt))  # as y is laid out


def norm_once(shape: tuple, dev: torch.device, dtype: torch.dtype, fmt: torch.memory_format, make: Make) -> None:
    """One BatchNorm input shape in training mode, forward and backward (weights float32, as under autocast)."""
    x = make(shape, device=dev, dtype=dtype).contiguous(memory_format=fmt).requires_grad_()
    c = shape[1]
    w = torch.ones(c, device=dev, requires_grad=True)
    b = torch.zeros(c, device=dev, requires_grad=True)
    rm, rv = torch.zeros(c, device=dev), torch.ones(c, device=dev)
    y = F.batch_norm(x, rm, rv, w, b, True, 0.03, 1e-3)
    y.backward(make(y.shape, device=dev, dtype=y.dtype).contiguous(memory_format=fmt))  # as y is laid out


def prewarm(
    convs: list[tuple],
    bns: list[tuple],
    dev: torch.device,
    dtype: torch.dtype = torch.float16,
    channels_last: bool = True,
) -> None:
    """Each recorded shape once (Record's convs and bns), last first: forward and backward (autograd's device
    thread), in `dtype` (BatchNorm's weights float32, as under autocast). benchmarks/start_variants.py runs it too."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    done = set()
    for key in reversed(convs):
        if key not in done:
            done.add(key)
            conv_once(key, dev, dtype, fmt, torch.randn)
    seen = set()
    for shape, _ in reversed(bns):
        if shape not in seen and len(shape) == 4:
            seen.add(shape)
            norm_once(shape, dev, dtype, fmt, torch.randn)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["plain", "beside", "before"])
    ap.add_argument("--model", default="LibreYOLO9t")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--imgsz", type=int, default=640)
    a = ap.parse_args()
    marks: dict[str, float] = {"import_torch": time.perf_counter() - T0}
    dev = torch.device("cuda")
    cfg = TrainConfig.from_overrides({"model": a.model, "batch": a.batch, "imgsz": a.imgsz})
    data, nc = _batch_on_device(cfg, a.batch, dev)
    family, size = parse_model_name(a.model)
    net = family.build(size, nc)
    train = family.train_net(net, cfg).to(dev).train().to(memory_format=torch.channels_last)
    loss_fn = family.loss(net, cfg, None)
    imgsz = (data["img"].shape[1], data["img"].shape[2])
    torch.cuda.synchronize()
    marks["ready"] = time.perf_counter() - T0
    helper, helper_s = None, [0.0]
    if a.mode != "plain":
        rec = shapes(train, data["img"])
        marks["shapes"] = time.perf_counter() - T0

        def run() -> None:
            t = time.perf_counter()
            prewarm(rec.convs, rec.bns, dev)
            helper_s[0] = time.perf_counter() - t

        helper = threading.Thread(target=run, name="prewarm")
        helper.start()
        if a.mode == "before":
            helper.join()
            marks["helper_joined"] = time.perf_counter() - T0
    for i in range(3):
        feed_targets(train, data["targets"], data["mask"], imgsz)
        out = train_forward(train, data["img"], torch.float16, True)
        loss = loss_fn(out, data["targets"], data["mask"], imgsz, 1.0)[0]
        torch.cuda.synchronize()
        marks[f"forward_loss_{i + 1}"] = time.perf_counter() - T0
        if helper is not None and i == 0:
            helper.join()  # beside: the backward's plans on autograd's thread come from the helper's passes
            marks["helper_joined"] = time.perf_counter() - T0
        loss.backward()
        torch.cuda.synchronize()
        marks[f"backward_{i + 1}"] = time.perf_counter() - T0
        train.zero_grad(set_to_none=True)
    res: dict[str, object] = {"mode": a.mode, **{k: round(v, 3) for k, v in marks.items()}}
    res["first_pass_s"] = round(marks["backward_1"] - marks["ready"], 3)
    res["first_pass_after_shapes_s"] = round(marks["backward_1"] - marks.get("shapes", marks["ready"]), 3)
    res["helper_s"] = round(helper_s[0], 3)
    if helper is not None:
        res["convs"], res["bns"] = len(rec.convs), len(rec.bns)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
