"""The console's own small settings file (the chosen theme), under the user's config folder.

$LIBREYOLO_CONSOLE_CONFIG names the file directly; otherwise $XDG_CONFIG_HOME/libreyolo/console.yaml,
else ~/.config/libreyolo/console.yaml."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import yaml


def settings_path() -> Path:
    env = os.environ.get("LIBREYOLO_CONSOLE_CONFIG")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".config") / "libreyolo" / "console.yaml"


def load_settings() -> dict[str, Any]:
    """The saved settings; an unreadable file is reported and ignored (the console still starts)."""
    path = settings_path()
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        return {}
    except (OSError, yaml.YAMLError) as e:
        print(f"libreyolo-console: ignoring {path}: {e}. Delete the file to start from defaults.", file=sys.stderr)
        return {}
    return data if isinstance(data, dict) else {}


def save_settings(settings: dict[str, Any]) -> None:
    path = settings_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(yaml.safe_dump(settings, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home must not break the console; the choice just is not remembered
