"""Model families: each is a Family spec; the registry maps model names to (family, size).

A family is a folder plus one registry line (`_BUILTIN` below): everything the one training loop, the
validator, the event stream, the CLI and the console need to know about it is declared here, so nothing
outside its folder names its loss terms, its keys or its modules."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

from libreyolo.keys import Key

# the built-in families, imported on first use of the registry (each module calls register())
_BUILTIN = (
    "libreyolo.families.yolo9",
    "libreyolo.families.yolox",
    "libreyolo.families.rtdetr",
    "libreyolo.families.classify",
)


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
        cfg: Any,
        epoch: int,
        ni: int,
        warmup_iters: int,
        momentum: float,
        steps_per_epoch: int,
    ) -> None:
        """Set each param group's lr (and momentum) for global iteration ni (ni // steps_per_epoch == epoch)."""


@dataclass(frozen=True)
class CapturePlan:
    """What the CUDA-graph manager may capture. `modules` are dotted names inside the train net ("" is the
    whole train net): `cuda_graph=true` captures each named module's forward and backward and runs the rest
    eagerly; `full_step` means the whole step (loss, optimizer, EMA) may be captured as one graph, which
    needs a loss with static shapes and no host synchronisation. `why_not_full`: why a family whose plan names
    modules cannot capture its whole step (`cuda_graph=full` says it when it falls back to the network graph)."""

    modules: tuple[str, ...] = ()
    full_step: bool = False
    why_not_full: str = ""

    @property
    def whole_net(self) -> bool:
        return self.modules == ("",)

    def __bool__(self) -> bool:
        return bool(self.modules)


NO_CAPTURE = CapturePlan()
WHOLE_NET = CapturePlan(("",), full_step=True)


@dataclass(frozen=True)
class Family:
    """What the one training loop needs to know about a model family."""

    name: str
    prefix: str  # model names are prefix + size, e.g. LibreYOLO9 + t
    sizes: tuple[str, ...]
    task: str
    build: Callable[[str, int], nn.Module]  # (size, num_classes) -> network, random init
    train_net: Callable[[nn.Module, Any], nn.Module]  # (network, TrainConfig) -> what the step runs
    loss: Callable[[nn.Module, Any, Reduce | None], LossFn]  # (network, cfg, normalizer reduce) -> loss fn
    postprocess: PostprocessFn
    loss_terms: tuple[str, ...]  # names of the logged loss terms, in the order the loss returns them
    keys: tuple[Key, ...] = ()  # the family's own training keys (merged into TrainConfig's spec)
    capture: CapturePlan = NO_CAPTURE
    supports_ddp: bool = True
    defaults: dict[str, Any] = field(default_factory=dict)  # defaults of shared keys that differ for this family
    param_groups: Callable[[nn.Module], list[dict[str, Any]]] | None = None  # None: engine.optim.param_groups
    schedule: ScheduleFn | None = None  # None: engine.optim.apply_schedule (warm-up, then linear or cosine)
    hooks: dict[str, Callable[[Any], None]] = field(default_factory=dict)  # e.g. on_mosaic_close(trainer)
    # (train net, batch, imgsz, dtype, device, target mask) -> random tensors shaped as the train net's training
    # forward returns them for a batch with that target mask, requiring grad: the kernel warm-up runs the loss on them
    # in a thread of its own while the network's first forward runs (engine/warmup.py). None: the loss's first call
    # follows the forward.
    example_outputs: ExampleOutputs | None = None

    @property
    def supports_full_graph(self) -> bool:
        return self.capture.full_step

    @property
    def models(self) -> list[str]:
        return [self.prefix + s for s in self.sizes]

    def key(self, name: str) -> Key | None:
        return next((k for k in self.keys if k.name == name), None)


_REGISTRY: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add a family (a built-in one at import, or a plugin's, or a test's); its models and keys become known.
    The registry lists the built-in families in _BUILTIN order whatever order they were imported in (--help and
    the docs follow it), then the others in the order they were registered."""
    if family.name in _REGISTRY and _REGISTRY[family.name] is not family:
        raise ValueError(f"a model family named {family.name!r} is already registered")
    _REGISTRY[family.name] = family
    ordered = sorted(_REGISTRY.values(), key=_rank)
    _REGISTRY.clear()
    _REGISTRY.update((f.name, f) for f in ordered)
    return family


def _rank(fam: Family) -> int:
    mod = getattr(fam.build, "__module__", "")
    return next((i for i, m in enumerate(_BUILTIN) if mod == m or mod.startswith(m + ".")), len(_BUILTIN))


def unregister(name: str) -> None:
    """Remove a family registered with register() (a test's or a plugin's)."""
    _REGISTRY.pop(name, None)


def families() -> dict[str, Family]:
    _load_builtin()
    return dict(_REGISTRY)


def get_family(name: str) -> Family:
    _load_builtin()
    if name not in _REGISTRY:
        raise KeyError(f"unknown family {name!r}; known: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def parse_model_name(name: str) -> tuple[Family, str] | None:
    """'LibreYOLO9t' -> (yolo9 family, 't'), 'LibreRTDETRr18' -> (rtdetr, 'r18'), 'LibreResNet18' -> (resnet, '18');
    None if the name is not a known model name."""
    _load_builtin()
    # the longest prefix first: LibreYOLOX must not be read as LibreYOLO + "x..."
    for fam in sorted(_REGISTRY.values(), key=lambda f: -len(f.prefix)):
        m = re.fullmatch(re.escape(fam.prefix) + r"([a-z0-9]+)", name, flags=re.IGNORECASE)  # sizes like r18, 18
        if m and m.group(1).lower() in fam.sizes:
            return fam, m.group(1).lower()
    return None


def model_names() -> list[str]:
    _load_builtin()
    return [m for f in _REGISTRY.values() for m in f.models]


def family_keys() -> dict[str, list[tuple[Family, Key]]]:
    """key name -> the families that declare it (a name may be shared, e.g. a `cls` gain), in registry order."""
    _load_builtin()
    out: dict[str, list[tuple[Family, Key]]] = {}
    for fam in _REGISTRY.values():
        for k in fam.keys:
            out.setdefault(k.name, []).append((fam, k))
    return out


_loaded = False


def _load_builtin() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for module in _BUILTIN:
            importlib.import_module(module)
