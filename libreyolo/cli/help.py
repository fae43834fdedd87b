"""`--help` tables generated from TrainConfig (the same source as docs/hyperparameters.md)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from libreyolo.cli.docs import group_title
from libreyolo.config import TrainConfig


def show_help(
    command: str,
    keys: set[str] | None = None,
    extra: dict[str, str] | None = None,
    defaults: dict[str, object] | None = None,
) -> int:
    """Print the keys' table; `defaults` are the command's own defaults where they differ from TrainConfig's
    (a benchmark that runs batch 8 must not say 16, predict's conf is 0.25)."""
    console = Console(highlight=False)
    console.print(f"usage: libreyolo {command} [key=value ...]\n", markup=False)
    table = Table(box=None, padding=(0, 2), show_header=True, header_style="bold")
    table.add_column("key")
    table.add_column("default")
    table.add_column("meaning")
    group = None
    for key, default, help_, grp in TrainConfig.spec():
        if keys is not None and key not in keys:
            continue
        if grp != group and keys is None:
            table.add_row(f"[dim]# {group_title(grp)}[/]", "", "")
            group = grp
        default = (defaults or {}).get(key, default)
        table.add_row(key, repr(default) if isinstance(default, str) else str(default), help_)
    for key, help_ in (extra or {}).items():
        table.add_row(key, "", help_)
    console.print(table)
    return 0
