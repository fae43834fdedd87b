"""key=value command-line arguments, typed through TrainConfig."""

from __future__ import annotations

from typing import Any

import yaml

from libreyolo.config import TrainConfig, unknown_key_message
from libreyolo.errors import ConfigError
from libreyolo.keys import boolean

flag = boolean  # an `extra` parser for command switches (json=true, save=1): TrainConfig's own booleans


def parse_kv(
    argv: list[str], allowed: set[str] | None = None, extra: dict[str, Any] | None = None, command: str = "train"
) -> dict[str, Any]:
    """['epochs=3', 'device=0,1'] -> {'epochs': 3, 'device': '0,1'}. Values are YAML-ish scalars; keys must
    be TrainConfig keys or a family's keys (optionally restricted to `allowed`) or one of `extra` (name ->
    parser). Whether a family key suits the model is checked when the run's config is made. Errors point to
    `libreyolo <command> --help`."""
    extra = extra or {}
    valid = sorted((allowed if allowed is not None else set(TrainConfig.all_keys())) | set(extra))
    out: dict[str, Any] = {}
    for arg in argv:
        if "=" not in arg:
            raise ConfigError(
                f"argument {arg!r} is not key=value (for example {'epochs=10' if command == 'train' else 'conf=0.5'}). "
                f"See `libreyolo {command} --help`."
            )
        key, value = arg.split("=", 1)
        key = key.strip().lstrip("-").replace("-", "_")
        if key not in valid:
            raise ConfigError(unknown_key_message(key, valid, command))
        if key in extra:
            try:
                out[key] = extra[key](value)
            except ValueError as e:  # bad values of command keys are named like TrainConfig's
                raise ConfigError(f"{key}={value!r} is not valid: {key} takes {e}") from None
        else:
            out[key] = TrainConfig.parse_value(key, _scalar(value))
    return out


def _scalar(v: str) -> Any:
    """'0,1' stays a string (a device list); '[0, 1]' becomes a list; numbers and booleans stay text for the
    typed parser, which knows what each key accepts."""
    s = v.strip()
    if s.startswith("[") and s.endswith("]"):
        try:
            return yaml.safe_load(s)
        except yaml.YAMLError:
            return s
    return s
