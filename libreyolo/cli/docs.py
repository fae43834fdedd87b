"""Generate docs/hyperparameters.md from TrainConfig: `python -m libreyolo.cli.docs > docs/hyperparameters.md`."""

from __future__ import annotations

from libreyolo.config import TrainConfig
from libreyolo.data.shapes import DEMO_SETTINGS
from libreyolo.data.shapes_cls import CLASSIFY_DEMO_SETTINGS
from libreyolo.families import get_family

GROUPS = {
    "run": "Run",
    "optim": "Optimisation",
    "loss": "Loss",
    "augment": "Augmentation",
    "speed": "Performance",
    "profile": "Profiler",
    "val": "Validation and prediction",
}


def group_title(group: str) -> str:
    """A spec group's heading; a family's own keys are headed by the family and its model names."""
    if group.startswith("family:"):
        fam = get_family(group[len("family:") :])
        return f"{fam.name} family keys ({', '.join(fam.models)})"
    return GROUPS.get(group, group)


def hyperparameters_markdown() -> str:
    lines = [
        "# Hyperparameters",
        "",
        "Every key of `libreyolo train key=value` and `LibreYOLO(...).train(key=value)`, generated from",
        "`libreyolo/config.py` (`TrainConfig`) and each model family's own keys (`Family.keys`), which only",
        "that family's models take. A family may also override a shared default (`Family.defaults`).",
        "The built-in dataset (`data=shapes`) suggests "
        + " ".join(f"`{k}={v}`" for k, v in DEMO_SETTINGS.items())
        + " for each of those keys you do not set; for a classifier, its built-in crops suggest "
        + " ".join(f"`{k}={v}`" for k, v in CLASSIFY_DEMO_SETTINGS.items())
        + ".",
        "",
    ]
    group = None
    for key, default, help_, grp in TrainConfig.spec():
        if grp != group:
            if group is not None:
                lines.append("")
            group = grp
            lines += [f"## {group_title(grp)}", "", "| key | default | meaning |", "| --- | --- | --- |"]
        lines.append(f"| `{key}` | `{default}` | {help_} |")
    lines += ["", "Python only: `callbacks=[fn, ...]`, callables that receive every event (see events.md).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(hyperparameters_markdown(), end="")
