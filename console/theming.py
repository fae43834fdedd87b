"""Themes: one textual Theme per `*.yaml` file of the repository's top-level `themes/` folder.

That folder ships inside the console as the data package `libreyolo_console.themes` (pyproject.toml maps it
to `themes/` and includes its `*.yaml`), so a built wheel and an editable install read it through
importlib.resources. Running from a checkout whose editable install predates that mapping, or with the
console's folder put on sys.path by hand, the folder is found beside the console's (`<repo>/themes`)."""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from textual.theme import Theme

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

THEMES_PACKAGE = "libreyolo_console.themes"
# <repo>/console/theming.py -> <repo>/themes (resolved: the console's folder may be reached through a link)
REPO_THEMES_DIR = Path(__file__).resolve().parents[1] / "themes"
DEFAULT_THEME = "libreyolo-dark"


def themes_dir() -> Traversable:
    """Where the shipped themes are: the data package when it is installed, else the checkout's folder."""
    try:
        folder = importlib.resources.files(THEMES_PACKAGE)
    except (ImportError, TypeError, ValueError):  # not installed as a package (or a namespace without a path)
        return REPO_THEMES_DIR
    return folder if _yaml_files(folder) else REPO_THEMES_DIR


def _yaml_files(folder: Traversable) -> list[Traversable]:
    try:
        return sorted((f for f in folder.iterdir() if f.name.endswith(".yaml") and f.is_file()), key=lambda f: f.name)
    except FileNotFoundError:
        return []


def load_themes(folder: Traversable | None = None) -> list[Theme]:
    """Every *.yaml theme in `folder` (default: the shipped ones), in their `order`. A broken file is an error
    naming it: themes ship with the console, so a bad one is a packaging bug to fix, not something to skip
    quietly."""
    themes: list[tuple[int, Theme]] = []
    for path in _yaml_files(themes_dir() if folder is None else folder):
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
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
