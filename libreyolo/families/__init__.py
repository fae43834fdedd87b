"""Model families, and the registry that maps model names to (family, size). Torch-free: the console, --help and the
docs read it without loading any network.

A family is a folder: its `__init__.py` registers a Family (this module's description: names, sizes, task, loss term
names, typed keys, capture plan) whose `impl` names the module holding its implementation (families/base.py's
FamilyImpl: network, loss, postprocess, optional param groups, schedule, hooks), which is imported on first use.
Families are discovered: every sub-package of this folder, and every entry point of the group `libreyolo.families`
(a plug-in's package, importable from anywhere), so adding one edits nothing outside its folder."""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass, field, fields
from importlib import metadata
from typing import TYPE_CHECKING, Any, Protocol

from libreyolo.keys import Key, key_list

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import nn

    from libreyolo.families.base import (
        Converter,
        ExampleOutputs,
        ExportSpec,
        FamilyImpl,
        HookFn,
        LossFactory,
        PostprocessFn,
        ScheduleFn,
    )

# the moments a family hook may be called at (FamilyImpl.hooks keys)
HOOKS = ("mosaic_close",)  # before the first epoch without mosaic (YOLOX switches its L1 term on)
ENTRY_POINTS = "libreyolo.families"  # plug-ins: an entry point whose module registers its families on import


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


class RunKeys(Protocol):
    """What a family reads of a run's configuration: config.TrainConfig is one (the families sit below config in
    the layers, so they name this instead). A family's own keys come typed through Family.options_of."""

    family: str | None  # the family the configuration was made for
    family_args: dict[str, Any]  # the values of that family's own keys
    epochs: int
    batch: int
    nbs: int | str
    lrf: float
    cos_lr: bool
    warmup_bias_lr: float
    warmup_momentum: float
    no_aug_epochs: int


@dataclass(frozen=True)
class NoKeys:
    """The typed keys of a family that has none of its own."""


@dataclass(frozen=True)
class Family:
    """What the one training loop, the CLI and the console need to know about a model family, without torch.

    impl: where its implementation is, "package.module" (its IMPL) or "package.module:NAME", a FamilyImpl; or the
    FamilyImpl itself (a family defined in one file, as the tests' toy family). options: the dataclass of its own
    typed keys (fields made with keys.option), merged into TrainConfig's spec; `options_of(cfg)` gives a run's
    values."""

    name: str
    prefix: str  # model names are prefix + size, e.g. LibreYOLO9 + t
    sizes: tuple[str, ...]
    task: str
    loss_terms: tuple[str, ...]  # names of the logged loss terms, in the order the loss returns them
    impl: Any
    options: type = NoKeys
    capture: CapturePlan = NO_CAPTURE
    supports_ddp: bool = True
    defaults: dict[str, Any] = field(default_factory=dict)  # defaults of shared keys that differ for this family
    order: int = 100  # where --help, the docs and the console list it (the built-in families: 0-9)
    # optional: "package.module" whose CONVERTERS (families/base.py's Converter) read foreign checkpoints of the
    # family, imported only when a file is not a libreyolo checkpoint; and where such weights are published (the
    # error for a weights name with no file says it: nothing is downloaded)
    convert: str = ""
    published: str = ""
    backbone: tuple[str, ...] = ()  # the network's backbone modules (dotted name prefixes): freeze=backbone
    # optional: "package.module" whose EXPORT (families/base.py's ExportSpec) says what the exporters need to know
    export: str = ""

    @property
    def keys(self) -> tuple[Key, ...]:
        """The family's own keys as Key records (parser, help), in declaration order."""
        return key_list(self.options)

    def key(self, name: str) -> Key | None:
        return next((k for k in self.keys if k.name == name), None)

    def options_of(self, cfg: RunKeys) -> Any:
        """The run's values of this family's keys (an instance of `options`): the config's own where it was made for
        a family with these options (this one, or a variant registered with the same options), the defaults where it
        was made for another (`model.val()` of a checkpoint builds one so)."""
        made_for = _REGISTRY.get(cfg.family or "")
        args = cfg.family_args if made_for is not None and made_for.options is self.options else None
        names = {f.name for f in fields(self.options)}
        return self.options(**{k: v for k, v in (args or {}).items() if k in names})

    @property
    def models(self) -> list[str]:
        return [self.prefix + s for s in self.sizes]

    @property
    def supports_full_graph(self) -> bool:
        return self.capture.full_step

    # --- the implementation, imported on first use -------------------------------------------------------------
    def implementation(self) -> FamilyImpl:
        got = _IMPLS.get(self.name)
        if got is None:
            if isinstance(self.impl, str):
                module, _, attr = self.impl.partition(":")
                got = getattr(importlib.import_module(module), attr or "IMPL")
                _check_hooks(self.name, got)
            else:
                got = self.impl
            _IMPLS[self.name] = got
        return got

    def converters(self) -> tuple[Converter, ...]:
        """The family's foreign-checkpoint converters (families/base.py's Converter), imported on first use."""
        return tuple(getattr(importlib.import_module(self.convert), "CONVERTERS", ())) if self.convert else ()

    def export_spec(self) -> ExportSpec | None:
        """The family's ExportSpec (families/base.py), imported on first use; None when it declares none."""
        return getattr(importlib.import_module(self.export), "EXPORT") if self.export else None  # noqa: B009

    @property
    def build(self) -> Callable[[str, int], nn.Module]:
        return self.implementation().build

    @property
    def train_net(self) -> Callable[[nn.Module, RunKeys], nn.Module]:
        return self.implementation().train_net

    @property
    def loss(self) -> LossFactory:
        return self.implementation().loss

    @property
    def postprocess(self) -> PostprocessFn:
        return self.implementation().postprocess

    @property
    def param_groups(self) -> Callable[[nn.Module], list[dict[str, Any]]] | None:
        return self.implementation().param_groups

    @property
    def schedule(self) -> ScheduleFn | None:
        return self.implementation().schedule

    @property
    def hooks(self) -> dict[str, HookFn]:
        return self.implementation().hooks

    @property
    def example_outputs(self) -> ExampleOutputs | None:
        return self.implementation().example_outputs


_REGISTRY: dict[str, Family] = {}
_IMPLS: dict[str, Any] = {}  # family name -> its FamilyImpl, once imported


def register(family: Family) -> Family:
    """Add a family (a built-in or a plug-in's at import, or a test's); its models and keys become known. The
    registry lists the families by `order`, then in the order they were registered."""
    if family.name in _REGISTRY and _REGISTRY[family.name] is not family:
        raise ValueError(f"a model family named {family.name!r} is already registered")
    if not isinstance(family.impl, str):  # an implementation given as a module path is checked when imported
        _check_hooks(family.name, family.impl)
    _REGISTRY[family.name] = family
    ordered = sorted(_REGISTRY.values(), key=lambda f: f.order)
    _REGISTRY.clear()
    _REGISTRY.update((f.name, f) for f in ordered)
    return family


def _check_hooks(name: str, impl: FamilyImpl) -> None:
    bad = [h for h in impl.hooks if h not in HOOKS]
    if bad:
        raise ValueError(f"family {name!r}: unknown hook(s) {bad}; a family hook is one of {', '.join(HOOKS)}")


def unregister(name: str) -> None:
    """Remove a family registered with register() (a test's or a plugin's)."""
    _REGISTRY.pop(name, None)
    _IMPLS.pop(name, None)


def families() -> dict[str, Family]:
    _discover()
    return dict(_REGISTRY)


def get_family(name: str) -> Family:
    _discover()
    if name not in _REGISTRY:
        raise KeyError(f"unknown family {name!r}; known: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def parse_model_name(name: str) -> tuple[Family, str] | None:
    """'LibreYOLO9t' -> (yolo9 family, 't'), 'LibreRTDETRr18' -> (rtdetr, 'r18'), 'LibreResNet18' -> (resnet, '18');
    None if the name is not a known model name."""
    _discover()
    # the longest prefix first: LibreYOLOX must not be read as LibreYOLO + "x..."
    for fam in sorted(_REGISTRY.values(), key=lambda f: -len(f.prefix)):
        m = re.fullmatch(re.escape(fam.prefix) + r"([a-z0-9]+)", name, flags=re.IGNORECASE)  # sizes like r18, 18
        if m and m.group(1).lower() in fam.sizes:
            return fam, m.group(1).lower()
    return None


def model_names() -> list[str]:
    _discover()
    return [m for f in _REGISTRY.values() for m in f.models]


def model_names_summary() -> str:
    """Every model name, one family at a time with its sizes after the first name: 'LibreYOLO9t/s/m/c, ...'."""
    _discover()
    return ", ".join(f.prefix + "/".join(f.sizes) for f in _REGISTRY.values() if f.sizes)


def family_keys() -> dict[str, list[tuple[Family, Key]]]:
    """key name -> the families that declare it (a name may be shared, e.g. a `cls` gain), in registry order."""
    _discover()
    out: dict[str, list[tuple[Family, Key]]] = {}
    for fam in _REGISTRY.values():
        for k in fam.keys:
            out.setdefault(k.name, []).append((fam, k))
    return out


_discovered = False


def _discover() -> None:
    """Import every family folder here and every plug-in's entry point, once: each registers its families."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for m in pkgutil.iter_modules(__path__):
        if m.ispkg:
            importlib.import_module(f"{__name__}.{m.name}")
    for ep in metadata.entry_points(group=ENTRY_POINTS):
        ep.load()
