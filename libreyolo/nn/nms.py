"""Packed detections: every family's postprocess returns one (N, 7) tensor per batch, batch index, x1, y1,
x2, y2, score, class, grouped by image in batch order with the best score first.

Semantics (both implementations below, to the last bit):
1. candidates: the (anchor, class) pairs scoring above conf (multi_label), or each anchor's best class (the first
   on a tie) above conf; ordered by score, ties by the lower flat index (anchor * C + class, or anchor); at
   most max_nms of them per image;
2. greedy per-class NMS at iou in that order. IoU is computed on float64 boxes shifted by (image * C + class)
   * span (span: the batch's coordinate extent + 2), so one torchvision NMS call can hold many images and
   classes: float32 offsets of up to ~1e5 px would round boxes to 0.008 px, float64 keeps them exact to ~1e-9;
3. the first max_det kept per image.

`nms_packed` does this for the whole batch on the device with a few host synchronisations per batch;
`nms_packed_reference` is the per-image loop that defines it (tests compare the two)."""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

from libreyolo.errors import InstallError

# Boxes per torchvision NMS call on CUDA: its kernel writes an N x N/64 bit mask (N^2/8 bytes: 12.5 MB at 10,000,
# well inside the H200's 50 MB L2) and then walks it in one thread block, one step per kept box, each reading
# that box's mask row: small masks keep those reads in L2, at the price of more calls (one host sync each).
# On the CPU the kernel compares every remaining box with each kept one, classes and images alike, so there each
# image gets its own call. `libreyolo bench val nms_chunk=N` tries other values.
CUDA_BOXES_PER_CALL = 10_000
# NMS runs in rounds over a prefix of each image's candidates, max(PREFIX_MIN, 8 * max_det) of them, then 4x more
# for the images still short of max_det survivors, and so on. Greedy NMS decides a box from the boxes before it
# only, so once a prefix yields max_det survivors they are exactly the first max_det of the full run. An untrained
# YOLOv9-t at conf=0.001 has 6,000 (3 classes) to 30,000 (capped, 80 classes) candidates per image and keeps
# about 1 in 6 of them: the first round decides nearly every image with a tenth of the NMS work.
PREFIX_MIN = 1024
_NONE = torch.iinfo(torch.int64).min  # the order key of a non-candidate


def _span(boxes: torch.Tensor) -> torch.Tensor:
    """0-d float64: an integer wider than the batch's finite coordinate range, so shifted groups never touch."""
    finite = boxes.float().nan_to_num(0.0, posinf=0.0, neginf=0.0)
    return (finite.amax() - finite.amin()).double().floor() + 2


def _shifted(boxes: torch.Tensor, group: torch.Tensor, span: torch.Tensor) -> torch.Tensor:
    return boxes.double() + (group.double() * span)[:, None]


def _rank(n: int, device: torch.device) -> torch.Tensor:
    """Strictly decreasing NMS scores: the kernel's own sort (not stable on every version) keeps our order."""
    return torch.arange(n, 0, -1, dtype=torch.float64, device=device)


def _order_key(score: torch.Tensor, conf: float) -> torch.Tensor:
    """(..., L) float32 scores -> int64 keys, unique per row: higher score first, then lower index; non-candidates
    (score <= conf, NaN) get _NONE. topk on these is exact and deterministic, where topk on tied floats is not."""
    bits = score.float().contiguous().view(torch.int32)
    mono = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long()  # orders like the floats, negatives included
    idx = torch.arange(score.shape[-1], device=score.device, dtype=torch.int64)
    key = mono * (1 << 32) + (0xFFFFFFFF - idx)  # |mono| < 2^31: no overflow
    return key.masked_fill_(~(score > conf), _NONE)


@torch.no_grad()
def nms_packed(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    conf: float,
    iou: float,
    max_det: int,
    multi_label: bool = False,
    max_nms: int = 30000,
    boxes_per_call: int | None = None,
) -> torch.Tensor:
    """boxes (B, A, 4) xyxy, scores (B, A, C) class probabilities -> packed (N, 7) detections (module docstring).

    Host synchronisations: one for the candidate counts, then per round one inside each torchvision NMS call (its
    output size) and one for the kept counts; usually there is one round."""
    B, A, C = scores.shape
    dev = boxes.device
    if B == 0 or A == 0 or C == 0 or max_det <= 0:
        return torch.zeros(0, 7, device=dev)
    per_call = boxes_per_call or (CUDA_BOXES_PER_CALL if dev.type == "cuda" else 1)
    cand_score, cand_cls, cand_anchor, counts = _top_candidates(scores, conf, multi_label, max_nms)
    cand_boxes = boxes.gather(1, cand_anchor[..., None].expand(-1, -1, 4))
    span = _span(boxes)
    count = counts.tolist()  # sync 1
    if not any(count):
        return torch.zeros(0, 7, device=dev)

    def run(take: list[int]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """NMS over each image's first take[b] candidates -> (image, position) of the kept, in packed order, and
        the kept count per image."""
        img, pos = _ragged(take, dev)
        g = img * C + cand_cls[img, pos]
        shifted, rank = _shifted(cand_boxes[img, pos], g, span), _rank(len(img), dev)
        keeps, start, n = [], 0, 0
        for t in take + [per_call + 1]:  # chunks of whole images: at most per_call boxes, or one image alone
            if n and n + t > per_call:
                keeps.append(_nms()(shifted[start : start + n], rank[start : start + n], iou) + start)
                start, n = start + n, 0
            n += t
        keep = torch.cat(keeps)
        return img[keep], pos[keep], torch.bincount(img[keep], minlength=B).tolist()  # sync

    # rounds over a growing prefix of each image's candidates (see PREFIX_MIN); an image is final once it has
    # max_det survivors or all its candidates went through
    take_n, todo, kept = max(PREFIX_MIN, 8 * max_det), count, [0] * B
    imgs, poss = [], []
    while any(todo):
        take = [min(c, take_n) for c in todo]
        img, pos, k = run(take)
        done = [t > 0 and (n >= max_det or t == c) for t, n, c in zip(take, k, todo)]
        if not all(d for d, t in zip(done, take) if t):
            sel = torch.tensor(done, device=dev)[img]
            img, pos = img[sel], pos[sel]
        imgs.append(img)
        poss.append(pos)
        kept = [n if d else old for n, d, old in zip(k, done, kept)]
        todo = [c if t and not d else 0 for c, t, d in zip(todo, take, done)]
        take_n *= 4
    img, pos = torch.cat(imgs), torch.cat(poss)
    if len(imgs) > 1:  # back to image order; (image, position) keys are unique
        order = torch.argsort(img * cand_score.shape[1] + pos)
        img, pos = img[order], pos[order]
    # the first max_det of each image: (image, rank within image) -> index into the image-sorted list
    final = [min(k, max_det) for k in kept]
    starts = torch.tensor([0] + kept[:-1], device=dev).cumsum(0)
    fi, fr = _ragged(final, dev)
    at = starts[fi] + fr
    img, pos = img[at], pos[at]
    return torch.cat(
        (
            img[:, None].float(),
            cand_boxes[img, pos].float(),
            cand_score[img, pos, None].float(),
            cand_cls[img, pos, None].float(),
        ),
        1,
    )


def _top_candidates(scores: torch.Tensor, conf: float, multi_label: bool, max_nms: int) -> tuple[torch.Tensor, ...]:
    """-> score, class, anchor (B, k) of each image's best k = min(max_nms, candidates' space) candidates in
    order (non-candidates last), and the candidate count per image (B,), all on the device."""
    B, A, C = scores.shape
    if multi_label:
        flat = scores.reshape(B, A * C)
    else:
        flat, best = scores.max(2)
    L = flat.shape[1]
    k = min(max_nms, L)
    # the int64 keys of a whole COCO batch (64 x 672,000) would take 344 MB at once: a few images at a time
    step = max(1, (1 << 24) // L)
    vals, idxs = [], []
    for b0 in range(0, B, step):
        top = _order_key(flat[b0 : b0 + step], conf).topk(k, dim=1)
        vals.append(top.values)
        idxs.append(top.indices)
    val, idx = torch.cat(vals), torch.cat(idxs)
    counts = (val != _NONE).sum(1)
    score = flat.gather(1, idx)
    if multi_label:
        return score, idx % C, idx // C, counts
    return score, best.gather(1, idx), idx, counts


def _ragged(lengths: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """[2, 0, 3] -> rows [0, 0, 2, 2, 2], positions [0, 1, 0, 1, 2] on the device, without a host sync."""
    n = torch.tensor(lengths, device=device)
    total = sum(lengths)
    rows = torch.repeat_interleave(torch.arange(len(lengths), device=device), n, output_size=total)
    return rows, torch.arange(total, device=device) - (n.cumsum(0) - n)[rows]


@torch.no_grad()
def nms_packed_reference(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    conf: float,
    iou: float,
    max_det: int,
    multi_label: bool = False,
    max_nms: int = 30000,
) -> torch.Tensor:
    """The per-image loop that defines `nms_packed`'s result (module docstring); slow, for tests."""
    B, A, C = scores.shape
    dev = boxes.device
    if B == 0 or A == 0 or C == 0 or max_det <= 0:
        return torch.zeros(0, 7, device=dev)
    span = _span(boxes)
    out = []
    for b in range(B):
        probs = scores[b]
        if multi_label:
            i, j = (probs > conf).nonzero(as_tuple=True)  # row-major: flat index order
            sc, cl = probs[i, j], j
        else:
            best, arg = probs.max(1)
            i = (best > conf).nonzero()[:, 0]
            sc, cl = best[i], arg[i]
        order = torch.sort(sc, descending=True, stable=True).indices[:max_nms]
        i, sc, cl = i[order], sc[order], cl[order]
        bx = boxes[b, i]
        keep = _nms()(_shifted(bx, b * C + cl, span), _rank(len(sc), dev), iou)[:max_det]
        n = keep.numel()
        out.append(
            torch.cat(
                (
                    torch.full((n, 1), float(b), device=dev),
                    bx[keep].float(),
                    sc[keep, None].float(),
                    cl[keep, None].float(),
                ),
                1,
            )
        )
    return torch.cat(out)


def split_detections(packed: torch.Tensor, batch_size: int) -> list[dict[str, torch.Tensor]]:
    """(N, 7) packed detections -> per image {boxes (n, 4), scores (n,), classes (n,) long}."""
    counts = torch.bincount(packed[:, 0].long(), minlength=batch_size).tolist() if len(packed) else [0] * batch_size
    return [{"boxes": p[:, 1:5], "scores": p[:, 5], "classes": p[:, 6].long()} for p in packed.split(counts)]


@functools.cache
def _nms() -> Any:
    """torchvision's NMS kernel (torch.ops.torchvision.nms, what torchvision.ops.nms calls), loaded from
    torchvision's compiled extension without importing the torchvision package: that import pulls in
    torch._dynamo, Triton and the ONNX op registry, 5-8 s on the H200 machine (docs/performance.md), which a
    run would pay at its first validation. Where the extension cannot be loaded directly, the package import."""
    try:
        folder = Path(importlib.util.find_spec("torchvision").submodule_search_locations[0])
        # the extension's name by torchvision release (_C_stable from 0.27 on), with Python's extension suffixes
        lib = next(
            folder / (n + x)
            for n in ("_C_stable", "_C")
            for x in importlib.machinery.EXTENSION_SUFFIXES
            if (folder / (n + x)).is_file()
        )
        torch.ops.load_library(str(lib))
        return torch.ops.torchvision.nms
    except Exception:
        from torchvision.ops import nms

        return nms


def check_nms(device: torch.device) -> None:
    """Run torchvision's NMS once on the device, before a run's first step: a torchvision built for another torch
    (`operator torchvision::nms does not exist`) would otherwise fail only at the first validation, an epoch in.
    Raises InstallError naming both versions and what to install."""
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0], [20.0, 20.0, 30.0, 30.0]], device=device)
    try:
        keep = _nms()(boxes, torch.tensor([0.9, 0.8, 0.7], device=device), 0.5)
        ok = keep.tolist() == [0, 2]
        why = f"it kept boxes {keep.tolist()} of a test where [0, 2] is right"
    except Exception as e:  # a missing operator, a library that does not load: RuntimeError, OSError, ImportError
        ok, why = False, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if not ok:
        try:
            tv = version("torchvision")
        except PackageNotFoundError:
            tv = "not installed"
        raise InstallError(
            f"torchvision's NMS does not run on {device} with torch {torch.__version__} and torchvision {tv} ({why}); "
            "torchvision must be the build made for this torch: install the pair together, e.g. pip install "
            f"--force-reinstall torch=={torch.__version__.split('+')[0]} torchvision (with the same --index-url "
            "as torch)"
        )
