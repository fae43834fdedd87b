"""Validation: loss on the validation set and COCO mAP of the (EMA) network.

Split in two so that the COCO evaluation leaves the training loop's path:
- `start_validation` holds the caller for what needs the device: forward, loss, batched NMS, boxes mapped back
  to original pixels on the device, and one device-to-host copy per batch;
- the COCO evaluation of the collected arrays then runs on a background thread: `PendingValidation.done()` says
  whether it finished, `.result()` waits for it and returns the metrics.
`validate` is the two in a row."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from libreyolo.data.dataset import YOLODataset
from libreyolo.eval.coco import CocoAccumulator, EvalProcess
from libreyolo.eval.graphed import EvalGraph
from libreyolo.nn.inputs import normalize

if TYPE_CHECKING:
    from libreyolo.families import Family

# COCO evaluations run one at a time: two at once would double their memory and share one interpreter lock
_EVAL_LOCK = threading.Lock()


def to_input(img: torch.Tensor, device: torch.device, channels_last: bool = False) -> torch.Tensor:
    """Host uint8 (B, H, W, 3) batch -> normalised float (B, 3, H, W) on the device."""
    return normalize(img.to(device, non_blocking=True), channels_last)


class Stages:
    """Seconds per validation stage, for `libreyolo bench val`: it synchronises the device around every stage,
    which a normal validation never does, so stages do not overlap while measured."""

    def __init__(self, device: torch.device):
        self.device, self.seconds = device, {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self._sync()
        t = time.perf_counter()
        yield
        self._sync()
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def no_stages(name: str) -> Any:
    return nullcontext()


class PendingValidation:
    """A validation whose device part is done and whose COCO evaluation runs on a background thread (or, when
    not started in the background, in the first call of result())."""

    def __init__(
        self,
        acc: CocoAccumulator | None,
        base: dict[str, Any],
        eval_workers: int = 1,
        background: bool = True,
        process: EvalProcess | None = None,
    ):
        """acc None: nothing is left to evaluate (classification counted its metrics on the device); base is the
        result. process: where the evaluation runs (CocoAccumulator.evaluate)."""
        self._acc, self._workers, self._base, self._out, self._error = acc, eval_workers, base, None, None
        self._process = process
        self._thread = None
        if acc is None:
            self._out = {**base, "eval_s": 0.0}
        elif background:
            self._thread = threading.Thread(target=self._evaluate, name="libreyolo-coco-eval", daemon=True)
            self._thread.start()

    def _evaluate(self) -> None:
        try:
            assert self._acc is not None
            with _EVAL_LOCK:
                t = time.perf_counter()
                metrics = self._acc.evaluate(self._workers, self._process)
                self._out = {
                    **metrics,
                    **self._base,
                    "eval_s": time.perf_counter() - t,
                    "detections": self._acc.num_detections,
                }
        except BaseException as e:  # handed to whoever asks for the result
            self._error = e
        self._acc = None  # the detections are no longer needed

    def done(self) -> bool:
        """Whether the COCO evaluation has finished (result() will not wait)."""
        return self._out is not None or self._error is not None

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        """Wait for the COCO evaluation -> precision, recall, map50, map, losses, images, time_s, eval_s, bad,
        detections. Raises what the evaluation raised; TimeoutError if it is still running after timeout."""
        if self._thread is None and not self.done():
            self._evaluate()
        elif self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"COCO evaluation still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return dict(self._out)


@torch.no_grad()
def start_validation(
    net: nn.Module,
    family: Family,
    loader: Any,
    device: torch.device,
    names: list[str],
    loss_fn: Callable | None = None,
    conf: float = 0.001,
    iou: float = 0.7,
    max_det: int = 300,
    autocast_dtype: torch.dtype | None = None,
    channels_last: bool = False,
    static_shape: bool = False,
    eval_workers: int = 1,
    stages: Stages | None = None,
    background: bool = True,
    graph: EvalGraph | None = None,
    multi_label: bool = True,
    eval_process: EvalProcess | None = None,
) -> PendingValidation:
    """Run the network over the loader (a `ValLoader` or any loader of `collate`d validation batches) and start
    the COCO evaluation. The pending result has precision, recall, map50, map, losses {term: value} (the family's
    loss terms), images, time_s (the seconds this call held the caller), eval_s (the COCO evaluation), bad
    (unreadable files) and detections.

    static_shape: pad every batch to the loader's batch size (zero images, dropped again after the forward), so
    the forward sees one input shape, e.g. for a captured graph or cuDNN's per-shape algorithm timing.
    eval_workers > 1: a large COCO evaluation is split by categories over that many processes (eval/coco.py).
    background=False: the evaluation runs in the caller's thread when result() is first called.
    graph: forward and loss through a CUDA graph of the (static_shape) batch shape (eval/graphed.py).
    multi_label: NMS keeps every class above conf per box (Ultralytics' validation) or only the best one.
    eval_process: a kept child process the COCO evaluation runs in (eval/coco.py EvalProcess).

    The background thread shares the interpreter lock with the caller: faster-coco-eval holds it through its C++
    evaluation (tens of ms for 200 images, seconds for 1.5 M detections), during which the caller's Python waits,
    unless eval_process runs it."""
    t0 = time.perf_counter()
    st = stages or no_stages
    was_training = net.training
    net.eval()
    dataset: YOLODataset = loader.dataset
    acc = CocoAccumulator(names, dataset.ground_truth())
    loss_sum = torch.zeros(len(family.loss_terms), device=device)
    batches, bad = 0, []
    size = getattr(loader, "batch_size", None) if static_shape else None
    it = iter(loader)
    try:
        while True:
            with st("loader"):
                batch = next(it, None)
            if batch is None:
                break
            bad.extend(batch["bad"])
            n = batch["img"].shape[0]
            if n == 0:
                continue
            with st("forward"):
                raw, items, imgsz = _forward(net, batch, device, size, channels_last, graph, autocast_dtype)
            if loss_fn is not None:
                with st("loss"):
                    if items is None:
                        targets, mask = (batch[k].to(device, non_blocking=True) for k in ("targets", "mask"))
                        _, items = loss_fn(raw, targets, mask, imgsz, 1.0)
                    loss_sum += items
            with st("postprocess"):
                packed = family.postprocess(
                    net, raw, imgsz, conf=conf, iou=iou, max_det=max_det, multi_label=multi_label
                )
                keys = ("scale_xy", "pad", "shape")  # per axis: dataset.py's _val_item
                dets = to_original(packed, *(batch[k].to(device, non_blocking=True) for k in keys))
            with st("to_host"):
                host = dets.cpu().numpy()  # the batch's one device-to-host copy
            acc.add_batch(batch["index"].numpy(), host)
            batches += 1
        losses = (loss_sum / max(batches, 1)).tolist()
    finally:
        net.train(was_training)
    base = {
        "losses": dict(zip(family.loss_terms, losses)),
        "images": acc.num_images,
        "time_s": time.perf_counter() - t0,
        "bad": bad,
    }
    return PendingValidation(acc, base, eval_workers, background, eval_process)


def _forward(
    net: nn.Module,
    batch: dict[str, Any],
    device: torch.device,
    size: int | None,
    channels_last: bool,
    graph: EvalGraph | None,
    autocast_dtype: torch.dtype | None,
) -> tuple[Any, torch.Tensor | None, tuple[int, int]]:
    """One batch through the network (padded with zero images to `size` where given) -> (raw outputs of the real
    images, the loss items where the graph computed them, else None, the input's (h, w))."""
    n = batch["img"].shape[0]
    x = to_input(batch["img"], device, channels_last)
    if size and n < size:
        x = torch.cat((x, x.new_zeros((size - n, *x.shape[1:])))).contiguous(
            memory_format=torch.channels_last if channels_last else torch.contiguous_format
        )
    imgsz = (x.shape[2], x.shape[3])
    items = None
    if graph is not None:
        targets, mask = (batch[k].to(device, non_blocking=True) for k in ("targets", "mask"))
        if x.shape[0] > n:  # the padding images have no labels
            targets = torch.nn.functional.pad(targets, (0, 0, 0, 0, 0, x.shape[0] - n))
            mask = torch.nn.functional.pad(mask, (0, 0, 0, x.shape[0] - n))
        raw, items = graph(x, targets, mask, imgsz)
    else:
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            raw = net(x)
    if x.shape[0] > n:  # padded: the loss of the real images only
        raw, items = _first(raw, n), None
    return raw, items, imgsz


def validate(
    net: nn.Module,
    family: Family,
    loader: Any,
    device: torch.device,
    names: list[str],
    loss_fn: Callable | None = None,
    conf: float = 0.001,
    iou: float = 0.7,
    max_det: int = 300,
    autocast_dtype: torch.dtype | None = None,
    channels_last: bool = False,
    **kwargs: Any,
) -> dict[str, Any]:
    """`start_validation` and its result (the metrics dict it describes); the COCO evaluation runs in this thread."""
    kwargs.setdefault("background", False)
    return start_validation(
        net, family, loader, device, names, loss_fn, conf, iou, max_det, autocast_dtype, channels_last, **kwargs
    ).result()


def to_original(packed: torch.Tensor, scale: torch.Tensor, pad: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
    """Packed detections in letterboxed input pixels -> the same in each image's original pixels, clipped to the
    image (scale (B, 2) x, y, or (B,) one for both axes; pad (B, 2) x, y; shape (B, 2) height, width: a batch's
    letterbox), on their device."""
    b = packed[:, 0].long()
    per_axis = scale[b].repeat(1, 2) if scale.dim() == 2 else scale[b, None]
    xyxy = (packed[:, 1:5] - pad[b].repeat(1, 2)) / per_axis
    wh = shape[b].flip(1).repeat(1, 2)
    xyxy = torch.minimum(xyxy.clamp(min=0), wh)
    return torch.cat((packed[:, :1], xyxy, packed[:, 5:]), 1)


def _first(out: Any, n: int) -> Any:
    """The first n images of whatever the network returned (tensors, tuples and lists of them), batch first."""
    if isinstance(out, torch.Tensor):
        return out[:n]
    if isinstance(out, (tuple, list)):
        return type(out)(_first(o, n) for o in out)
    if isinstance(out, dict):
        return {k: _first(v, n) for k, v in out.items()}
    return out
