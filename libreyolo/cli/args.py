"""key=value command-line arguments, typed through TrainConfig (the parser itself is config.parse_kv: the console
checks its form with it too, through the torch-free face libreyolo.api)."""

from __future__ import annotations

from libreyolo.config import parse_kv
from libreyolo.keys import boolean

flag = boolean  # an `extra` parser for command switches (json=true, save=1): TrainConfig's own booleans

__all__ = ["flag", "parse_kv"]
