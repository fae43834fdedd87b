"""A built model as the layers below libreyolo/model.py read it: predict, val, export, the weights' transfer and the
out-of-memory explainer take one. libreyolo/model.py's LibreYOLO is one; those layers sit below it and must not
import it, so they name this protocol instead."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch import nn

    from libreyolo.families import Family


class BuiltModel(Protocol):
    """A family and size, its network, the class names it predicts and the image size it was trained at."""

    family: Family
    size: str
    names: list[str]
    imgsz: int
    source: str  # what it was made from: a model name, a checkpoint or an exported file
    trained: bool  # False: random weights
    metrics: dict[str, float]  # the best epoch's, from the checkpoint
    # an exported graph's metadata (export/meta.py's ExportMeta), None for a PyTorch network: export sits above
    # families, so its type cannot be named here
    exported: Any
    net: nn.Module

    @property
    def model_name(self) -> str: ...

    @property
    def nc(self) -> int: ...
