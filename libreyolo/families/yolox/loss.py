"""YOLOX loss: SimOTA assignment, then IoU (1 - IoU^2), objectness BCE, IoU-aware class BCE and, once mosaic
has closed, an L1 term on the raw box outputs; all normalised by the number of foreground anchors.

Static shapes and no host synchronisation: background anchors are selected away with torch.where instead of
indexed away (__call__ says why not with a zero weight), the normaliser stays a device tensor, and the L1 switch
is a plain Python attribute read at call time (a graph captured after the switch contains the L1 kernels; one
captured before does not, hence the re-capture the family's hook asks for)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from libreyolo.families.yolox.assigner import simota
from libreyolo.nn.head import make_anchors

NBS = 64  # YOLOX's learning rates are per 64 images


def as_raw(outputs: Any) -> torch.Tensor:
    """What the network returns -> its (B, A, 5 + nc) tensor. Also accepts a tuple holding it, and the tuple
    of per-image (A, 5 + nc) tensors that iterating over it gives (a graph runner that makes a tuple of the
    train net's output by iterating it)."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    outputs = tuple(outputs)
    if len(outputs) == 1 and outputs[0].dim() == 3:
        return outputs[0]
    return torch.stack(outputs)


MAX_LOG_SIZE = math.log(1e4)  # log-sizes (in strides) above this are clamped: no box is 10^4 strides wide


def anchor_grid(
    imgsz: tuple[int, int], strides: tuple[int, ...], device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (grid (A, 2) cell corners in cells, stride (A, 1)) of every anchor, levels in the head's order."""
    shapes = [(imgsz[0] // s, imgsz[1] // s) for s in strides]
    centres, stride = make_anchors(shapes, list(strides), device, dtype)
    return centres - 0.5, stride


def decode_boxes(reg: torch.Tensor, grid: torch.Tensor, stride: torch.Tensor) -> torch.Tensor:
    """reg (..., A, 4) raw box outputs -> xyxy pixels. YOLOX's decode: centre = (offset + cell corner) * stride,
    size = exp(log-size) * stride, the log-size clamped at MAX_LOG_SIZE: an unconstrained output (a background
    anchor's, which no loss term trains, or any under float16 at a high LR) overflows exp from ~89 and a box area
    from ~42, and an infinite box makes NaN in every IoU it enters (inf - inf), the postprocess's NMS included."""
    xy = (reg[..., :2] + grid) * stride
    wh = reg[..., 2:4].clamp(max=MAX_LOG_SIZE).exp() * stride
    return torch.cat((xy - wh / 2, xy + wh / 2), -1)


def decode(
    raw: torch.Tensor, imgsz: tuple[int, int], strides: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """raw (B, A, 5 + nc) -> (boxes (B, A, 4) xyxy pixels, grid (A, 2) cell corners in cells, stride (A, 1))."""
    grid, stride = anchor_grid(imgsz, strides, raw.device, raw.dtype)
    return decode_boxes(raw[..., :4], grid, stride), grid, stride


def iou_aligned(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of matching rows of two xyxy box tensors (..., 4), as YOLOX's IOUloss computes it."""
    lt = torch.maximum(a[..., :2], b[..., :2])
    rb = torch.minimum(a[..., 2:], b[..., 2:])
    overlap = (lt < rb).all(-1)
    inter = torch.where(overlap, _area(lt, rb), 0.0)
    union = _area(a[..., :2], a[..., 2:]) + _area(b[..., :2], b[..., 2:]) - inter
    return inter / (union + 1e-16)


def _area(lt: torch.Tensor, rb: torch.Tensor) -> torch.Tensor:
    """w * h, not .prod(-1): prod's backward counts zero inputs with .item(), a host synchronisation (seen on the
    H200 under torch.cuda.set_sync_debug_mode("error")) that a captured step cannot have."""
    wh = rb - lt
    return wh[..., 0] * wh[..., 1]


class YOLOXLoss:
    """Call with the network's raw output and padded targets; returns (loss for backward, detached
    [iou, obj, cls, l1] before their gains)."""

    def __init__(
        self,
        nc: int,
        strides: tuple[int, ...] = (8, 16, 32),
        box: float = 5.0,
        obj: float = 1.0,
        cls: float = 1.0,
        l1: float = 1.0,
        reduce_normalizer: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.nc, self.strides = nc, tuple(strides)
        self.gains = (box, obj, cls, l1)
        self.use_l1 = False  # switched on by the family's mosaic_close hook (YOLOX: the last no-aug epochs)
        # under DDP: max(global foreground count, 1) / world size (see distributed/context.py)
        self.reduce_normalizer = reduce_normalizer

    def __call__(
        self, outputs: Any, targets: torch.Tensor, mask: torch.Tensor, imgsz: tuple[int, int], batch_scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """targets (B, M, 5) = class, x1, y1, x2, y2 in input pixels; mask (B, M) bool. The loss is the weighted
        sum times batch_scale / 64: the trainer passes the global batch and accumulates gradients to nbs images,
        which gives YOLOX's rule of an LR per 64 images."""
        raw = as_raw(outputs).float()
        grid, stride = anchor_grid(imgsz, self.strides, raw.device, raw.dtype)
        obj, cls = raw[..., 4], raw[..., 5:]
        a = simota(
            cls.detach(),
            obj.detach(),
            decode_boxes(raw[..., :4].detach(), grid, stride),
            (grid + 0.5) * stride,
            stride.squeeze(-1),
            targets[..., 0],
            targets[..., 1:5],
            mask,
        )
        fg, fg3 = a.fg, a.fg.unsqueeze(-1)

        n_fg = fg.float().sum()
        # under DDP the reducer returns max(global total, 1) / world size; clamping the local count instead
        # would change the gradient whenever some rank has no foreground
        n_fg = self.reduce_normalizer(n_fg) if self.reduce_normalizer is not None else n_fg.clamp(min=1.0)

        # YOLOX indexes the foreground away; static shapes can't, and weighting a term by fg (0/1) does not remove
        # a background anchor whose term is inf or NaN (NaN * 0 = NaN, in the forward and, through the chain
        # rule, in the backward). So background anchors' box outputs are replaced by zeros before anything is
        # computed from them (their box then is their own cell, their target that same box), and every term
        # they must not enter is selected away with where, whose backward gives them an exact zero.
        reg = torch.where(fg3, raw[..., :4], 0.0)
        boxes = decode_boxes(reg, grid, stride)
        t_boxes = torch.where(fg3, a.target_boxes, boxes.detach())
        iou_loss = torch.where(fg, 1.0 - iou_aligned(boxes, t_boxes).square(), 0.0).sum()
        obj_loss = F.binary_cross_entropy_with_logits(obj, fg.float(), reduction="sum")
        cls_bce = F.binary_cross_entropy_with_logits(cls, a.target_cls, reduction="none").sum(-1)
        cls_loss = torch.where(fg, cls_bce, 0.0).sum()
        if self.use_l1:
            t_xy = (t_boxes[..., :2] + t_boxes[..., 2:]) / 2 / stride - grid
            t_wh = torch.log((t_boxes[..., 2:] - t_boxes[..., :2]) / stride + 1e-8)
            target = torch.where(fg3, torch.cat((t_xy, t_wh), -1), 0.0)
            l1_loss = torch.where(fg, (reg - target).abs().sum(-1), 0.0).sum()
        else:
            l1_loss = raw.new_zeros(())
        items = torch.stack((iou_loss, obj_loss, cls_loss, l1_loss)) / n_fg

        g_box, g_obj, g_cls, g_l1 = self.gains
        total = items[0] * g_box + items[1] * g_obj + items[2] * g_cls + items[3] * g_l1
        return total * (batch_scale / NBS), items.detach()
