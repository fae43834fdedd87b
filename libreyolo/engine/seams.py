"""What the engine needs of the model it trains, as a protocol: libreyolo/model.py's LibreYOLO sits above the
engine, which must not import it."""

from __future__ import annotations

from typing import Any, Protocol

from torch import nn

from libreyolo.families import Family


class TrainableModel(Protocol):
    """The model a run trains: its family and size, a checkpoint's record put back (resume), and the network made
    ready for the dataset's classes."""

    family: Family
    size: str

    def load_record(self, ckpt: dict[str, Any]) -> None: ...

    def prepare_for_training(self, names: list[str], fresh: bool = True) -> nn.Module: ...
