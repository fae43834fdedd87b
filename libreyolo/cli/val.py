"""libreyolo val model=... data=... [split=val imgsz= batch= device= conf= iou= max_det= multi_label=]: the task's
metrics (detection: P, R, mAP50, mAP50-95; classification: top1, top5)."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from libreyolo.cli.args import flag, parse_kv
from libreyolo.cli.help import show_help
from libreyolo.render import per_class_table
from libreyolo.tasks import get_task
from libreyolo.val import VAL_KEYS

KEYS = VAL_KEYS | {"model", "data"}


def run(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        return show_help(
            "val",
            KEYS,
            {
                "split": "val (default), test or train: a split the dataset yaml has",
                "json": "print the metrics as JSON",
            },
        )
    kw = parse_kv(argv, KEYS, {"split": str, "json": flag}, command="val")
    from libreyolo import LibreYOLO

    as_json = kw.pop("json", False)
    model = LibreYOLO(kw.pop("model", "LibreYOLO9t"))
    m = model.val(kw.pop("data", "shapes"), **kw)
    task = get_task(model.family.task)
    if as_json:
        keys = (*task.metric_names, "losses", "images", "skipped", *(["per_class"] if "per_class" in m else []))
        print(json.dumps({k: m[k] for k in keys}))
        return 0
    t = Table(title=f"{model.model_name} on {m['images']} images")
    for c in task.labels:
        t.add_column(c, justify="right")
    t.add_row(*(f"{m[k]:.4f}" for k in task.metric_names))
    Console().print(t)
    if m.get("per_class"):
        Console().print(per_class_table(m["per_class"], m))
    for f in m["skipped"]:
        Console(stderr=True).print(f"[yellow]skipped[/] {f}")
    return 0
