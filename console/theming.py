"""Themes shipped in console/themes/*.yaml (package data): one textual Theme per file."""

from __future__ import annotations

from pathlib import Path

import yaml
from textual.theme import Theme

THEMES_DIR = Path(__file__).resolve().parent / "themes"
DEFAULT_THEME = "libreyolo-dark"


def load_themes(folder: Path = THEMES_DIR) -> list[Theme]:
    """Every *.yaml theme in `folder`, in their `order`. A broken file is an error naming it: themes ship
    with the console, so a bad one is a packaging bug to fix, not something to skip quietly."""
    themes: list[tuple[int, Theme]] = []
    for path in sorted(folder.glob("*.yaml")):
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
        if not isinstance(raw, dict) or "name" not in raw or "primary" not in raw:
            raise ValueError(f"{path}: a theme needs at least `name` and `primary` (see textual.theme.Theme)")
        order = int(raw.pop("order", 100))
        try:
            themes.append((order, Theme(**raw)))
        except TypeError as e:
            raise ValueError(f"{path}: {e}; the keys are textual.theme.Theme's fields") from None
    return [t for _, t in sorted(themes, key=lambda ot: (ot[0], ot[1].name))]


def next_theme(current: str, names: list[str]) -> str:
    """The theme after `current` in `names` (wrapping); the first one if `current` is not ours."""
    if current not in names:
        return names[0]
    return names[(names.index(current) + 1) % len(names)]
