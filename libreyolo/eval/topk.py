"""Classification's validation: loss and top-1 / top-5 accuracy, counted on the device (one host copy at the end,
nothing left to evaluate in the background). Called by `validator.start_validation` for task "classify"."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from libreyolo.eval.graphed import EvalGraph

if TYPE_CHECKING:
    from libreyolo.families import Family


def topk_correct(logits: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, k: int = 5) -> torch.Tensor:
    """-> (2,) the weighted count of images whose class is the best guess, and among the best min(k, nc)."""
    hit = logits.topk(min(k, logits.shape[1]), dim=1).indices == labels[:, None]
    return torch.stack((hit[:, 0].to(weight.dtype) @ weight, hit.any(1).to(weight.dtype) @ weight))


def _guesses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """-> (n, 3) int64: the label, the best guess, and how many classes scored above the label (0: right)."""
    rank = (logits > logits.gather(1, labels[:, None])).sum(1)
    return torch.stack((labels, logits.argmax(1), rank), 1)


@torch.no_grad()
def start_topk_validation(
    net: nn.Module,
    family: Family,
    loader: Any,
    device: torch.device,
    loss_fn: Callable[..., Any] | None,
    autocast_dtype: torch.dtype | None,
    to_input: Callable[[torch.Tensor], torch.Tensor],
    size: int | None,
    graph: EvalGraph | None,
    stages: Callable[[str], AbstractContextManager[Any]],
) -> dict[str, Any]:
    """Forward (padded to `size` images when set, through `graph` when given), loss and top-k counts per batch.
    -> top1, top5, losses, images, time_s, bad; and per image (in loader order) for the plots: label, pred (the best
    guess), index (the dataset's), and topk (the accuracy with the right class among the best k, k = 1..min(nc, 5))."""
    t0 = time.perf_counter()
    was_training = net.training
    net.eval()
    loss_sum = torch.zeros(len(family.loss_terms), device=device)
    top_k = 0  # min(nc, 5), from the first batch's logits
    hits = torch.zeros(2, device=device)
    batches, images, bad = 0, 0, []
    per_image: list[torch.Tensor] = []  # (n, 3) label, best guess, rank of the label, per batch, on the device
    indices: list[torch.Tensor] = []
    try:
        for batch in loader:
            bad.extend(batch["bad"])
            n = batch["img"].shape[0]
            if n == 0:
                continue
            with stages("forward"):
                x = to_input(batch["img"])
                targets = batch["targets"].to(device, non_blocking=True)
                mask = batch["mask"].to(device, non_blocking=True)
                if size and n < size:  # one input shape for a captured graph: zero images that weigh nothing
                    x = torch.cat((x, x.new_zeros((size - n, *x.shape[1:])))).contiguous(
                        memory_format=torch.channels_last
                        if x.is_contiguous(memory_format=torch.channels_last)
                        else torch.contiguous_format
                    )
                    targets = torch.nn.functional.pad(targets, (0, 0, 0, 0, 0, size - n))
                    mask = torch.nn.functional.pad(mask, (0, 0, 0, size - n))
                imgsz = (x.shape[2], x.shape[3])
                items = None
                if graph is not None:
                    logits, items = graph(x, targets, mask, imgsz)
                else:
                    with torch.autocast(
                        device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None
                    ):
                        logits = net(x)
            with stages("loss"):
                if loss_fn is not None:
                    loss_sum += items if items is not None else loss_fn(logits, targets, mask, imgsz, 1.0)[1]
                hits += topk_correct(logits.float(), targets[:, 0, 0].long(), mask[:, 0].float())
                per_image.append(_guesses(logits[:n].float(), targets[:n, 0, 0].long()))
                top_k = min(logits.shape[1], 5)
                indices.append(batch["index"][:n])
            batches += 1
            images += n
        with stages("to_host"):
            top = (hits / max(images, 1)).tolist()  # the validation's one device-to-host copy
            losses = (loss_sum / max(batches, 1)).tolist()
            guesses = torch.cat(per_image).cpu().numpy() if per_image else np.zeros((0, 3), np.int64)
    finally:
        net.train(was_training)
    return {
        "top1": top[0],
        "top5": top[1],
        "losses": dict(zip(family.loss_terms, losses)),
        "images": images,
        "time_s": time.perf_counter() - t0,
        "bad": bad,
        "label": guesses[:, 0],
        "pred": guesses[:, 1],
        "index": torch.cat(indices).numpy() if indices else np.zeros(0, np.int64),
        "topk": [float((guesses[:, 2] < k).mean()) if len(guesses) else 0.0 for k in range(1, top_k + 1)],
    }
