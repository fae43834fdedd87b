"""What a family's implementation provides (the torch side of a family; its torch-free description is
families/__init__.py's Family): the network, the loss, the postprocess and the optional parts, and the types the
engine calls them with. A family's folder holds an implementation module whose IMPL is a FamilyImpl."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

from libreyolo.families import RunKeys

Reduce = Callable[[torch.Tensor], torch.Tensor]  # DDP's all-reduce of the loss normaliser
# Family.example_outputs: (train net, batch, imgsz, dtype, device, the batch's target mask (B, M)) -> outputs
ExampleOutputs = Callable[[nn.Module, int, tuple[int, int], torch.dtype, torch.device, torch.Tensor], Any]
N = TypeVar("N", bound=nn.Module)


def random_output(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, unit: bool = False) -> torch.Tensor:
    """For example_outputs: a random leaf tensor that requires grad, drawn from a generator of its own (the warm-up
    makes it beside the setup, whose random streams must not move). unit: uniform in (0, 1), as normalised boxes
    (a loss that matches boxes by IoU needs real ones), else normal."""
    g = torch.Generator(device).manual_seed(0)
    draw = torch.rand if unit else torch.randn
    return draw(shape, generator=g, device=device, dtype=dtype, requires_grad=True)


def own(net: nn.Module, cls: type[N]) -> N:
    """The family's own network class, from the nn.Module the engine hands a family function."""
    if not isinstance(net, cls):
        raise TypeError(f"expected a {cls.__name__} network, got {type(net).__name__}")
    return net


class LossFn(Protocol):
    def __call__(
        self, outputs: Any, targets: torch.Tensor, mask: torch.Tensor, imgsz: tuple[int, int], batch_scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """outputs: whatever the train net (training) or the detector (validation) returns; targets (B, M, 5)
        class, x1, y1, x2, y2 in input pixels, padded, with mask (B, M). -> (the loss to back-propagate,
        the detached loss terms in `Family.loss_terms` order, shape (len(loss_terms),)). Static shapes and no
        host synchronisation where the family supports whole-step capture."""


class LossFactory(Protocol):
    def __call__(self, net: nn.Module, cfg: RunKeys, reduce_normalizer: Reduce | None = None, /) -> LossFn:
        """(network, the run's keys, DDP's all-reduce of the loss normaliser or None) -> the loss function."""


class PostprocessFn(Protocol):
    def __call__(
        self,
        net: nn.Module,
        raw: Any,
        imgsz: tuple[int, int],
        conf: float,
        iou: float,
        max_det: int,
        multi_label: bool = False,
    ) -> torch.Tensor:
        """Whatever the detector returns in eval mode -> packed detections (N, 7) on its device: batch index,
        x1, y1, x2, y2 (input pixels), score, class; grouped by image in batch order, best score first."""


class ScheduleFn(Protocol):
    def __call__(
        self,
        optimizer: torch.optim.Optimizer,
        cfg: RunKeys,
        epoch: int,
        ni: int,
        warmup_iters: int,
        momentum: float,
        steps_per_epoch: int,
    ) -> None:
        """Set each param group's lr (and momentum) for global iteration ni (ni // steps_per_epoch == epoch)."""


HookFn = Callable[["HookContext"], None]


@dataclass
class HookContext:
    """What a family hook gets: the moment it is called at and the narrow handles it may act on, not the trainer.

    epoch: the epoch about to start; losses: the run's training and validation loss objects (the hook may switch a
    term on); invalidate(reason): drop captured graphs whose loss no longer computes what the step computes (they
    are captured anew, and the next validation captures its graph anew)."""

    epoch: int
    losses: tuple[Any, ...]
    invalidate: Callable[[str], None]


@dataclass(frozen=True)
class Foreign:
    """What a family's converter read from a foreign checkpoint: the size it holds, its weights in the family's own
    layout (their names and shapes those of `build(size, nc)`), its class count, and its class names where the file
    has them."""

    size: str
    state: dict[str, torch.Tensor]
    nc: int
    names: list[str] | None = None
    imgsz: int | None = None
    partial: bool = False  # a part of the network only (a classifier's weights as a detector's backbone): pretrained=

    @classmethod
    def with_meta(cls, size: str, state: dict[str, torch.Tensor], nc: int, meta: dict[str, Any]) -> Foreign:
        """A LibreYOLO 1.6 file's record: its class names ({index: name}, kept where there is one per class) and
        image size, read off the metadata beside the weights."""
        names, imgsz = meta.get("names"), meta.get("imgsz")
        listed = [str(names[i]) for i in range(nc)] if isinstance(names, dict) and len(names) == nc else None
        return cls(size, state, nc, listed, int(imgsz) if isinstance(imgsz, int) else None)


@dataclass(frozen=True)
class Converter:
    """Reads one foreign checkpoint format of a family (the family's convert.py lists them in CONVERTERS).

    read(tensors, meta): the file's weights (a flat name -> tensor dict) and its other top-level fields -> a
    Foreign, or None when the file is not of this format; a file of this format that cannot load (a size this
    project does not build) raises CheckpointError saying why. write(state, size): the family's own weights in this
    format's layout (None: this format is read only)."""

    format: str  # what it reads, as the note of what was read and the list of known formats name it
    read: Callable[[dict[str, torch.Tensor], dict[str, Any]], Foreign | None]
    write: Callable[[dict[str, torch.Tensor], str], dict[str, torch.Tensor]] | None = None


# (network, its eval-mode outputs, input (h, w)) -> boxes (B, A, 4) xyxy in input pixels, class scores (B, A, C)
BoxesScores = Callable[[nn.Module, Any, tuple[int, int]], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class ExportSpec:
    """How libreyolo/export treats a family's network (the family's export.py holds its EXPORT; Family.export names
    that module). outputs: names of the eval-mode forward's outputs, in order; meaning: what they hold, written into
    the exported file's metadata. boxes_scores: a YOLO-style head's decode, before NMS: with it, nms=true puts the
    decode and NMS in the graph; None refuses nms=true. fixed_size: non-empty, why the graph holds for the export's
    image size only (dynamic=true is refused with this reason; dynamic=batch is not)."""

    outputs: tuple[str, ...]
    meaning: str
    boxes_scores: BoxesScores | None = None
    fixed_size: str = ""


@dataclass(frozen=True)
class FamilyImpl:
    """A family's implementation. Every callable receives the family's own network class (see `own`)."""

    build: Callable[[str, int], nn.Module]  # (size, num_classes) -> network, random init
    train_net: Callable[[nn.Module, RunKeys], nn.Module]  # (network, the run's keys) -> what the step runs
    loss: LossFactory
    postprocess: PostprocessFn
    param_groups: Callable[[nn.Module], list[dict[str, Any]]] | None = None  # None: engine.optim.param_groups
    schedule: ScheduleFn | None = None  # None: engine.optim.apply_schedule (warm-up, then linear or cosine)
    # hooks at the engine's moments (families.HOOKS: "mosaic_close", before the first epoch without mosaic)
    hooks: dict[str, HookFn] = field(default_factory=dict)
    # (train net, batch, imgsz, dtype, device, target mask) -> random tensors shaped as the train net's training
    # forward returns them for a batch with that target mask, requiring grad: the kernel warm-up runs the loss on them
    # in a thread of its own while the network's first forward runs (engine/warmup.py). None: the loss's first call
    # follows the forward.
    example_outputs: ExampleOutputs | None = None
