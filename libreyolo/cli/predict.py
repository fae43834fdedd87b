"""libreyolo predict model=... source=img.jpg [conf=0.25 iou=0.7 imgsz= device= multi_label= save=false json=false]

An image that cannot be read is skipped and named on stderr; the others are predicted. The exit status is 0 when
at least one image was predicted, 2 (an error) when none could be read."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import cv2
from rich.console import Console
from rich.markup import escape

from libreyolo.cli.args import flag, parse_kv
from libreyolo.cli.help import show_help
from libreyolo.runs import increment_run_dir

KEYS = {"model", "imgsz", "device", "conf", "iou", "max_det", "multi_label", "project", "name"}


def run(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        return show_help(
            "predict",
            KEYS,
            {
                "source": "image, folder of images, or a comma-free list",
                "save": "write annotated images to runs/predict/exp",
                "json": "print detections as JSON lines",
            },
            defaults={"conf": 0.25, "project": "runs/predict"},
        )
    kw = parse_kv(argv, KEYS, {"source": str, "save": flag, "json": flag}, command="predict")
    from libreyolo import LibreYOLO
    from libreyolo.errors import ConfigError
    from libreyolo.predict import UnreadableImageWarning

    if "source" not in kw:
        raise ConfigError("predict needs source=PATH (an image or a folder of images)")
    model = LibreYOLO(kw.pop("model", "LibreYOLO9t"))
    save, as_json = kw.pop("save", False), kw.pop("json", False)
    out_dir = increment_run_dir(kw.pop("project", "runs/predict"), kw.pop("name", "exp"), False) if save else None
    kw.setdefault("conf", 0.25)
    with warnings.catch_warnings():  # the skipped files are listed once, at the end
        warnings.simplefilter("ignore", UnreadableImageWarning)
        results = model.predict(kw.pop("source"), **kw)
    for r in results:
        dets = r.to_list()
        if as_json:
            print(json.dumps({"path": r.path, "detections": dets}))
        else:
            summary = ", ".join(f"{d['name']} {d['score']:.2f}" for d in dets) or "nothing"
            print(f"{r.path}: {summary}")
        if out_dir is not None:
            img = cv2.cvtColor(r.image, cv2.COLOR_RGB2BGR)
            for i, d in enumerate(dets):
                # a classifier's top-k have no box: their lines are written in the top-left corner
                x1, y1, x2, y2 = (int(v) for v in d["box"]) if "box" in d else (4, 14 * (i + 1) + 4, 0, 0)
                if "box" in d:
                    cv2.rectangle(img, (x1, y1), (x2, y2), (0, 255, 0), 2)
                cv2.putText(
                    img,
                    f"{d['name']} {d['score']:.2f}",
                    (x1, max(y1 - 4, 10)),
                    cv2.FONT_HERSHEY_SIMPLEX,
                    0.45,
                    (0, 255, 0),
                    1,
                )
            cv2.imwrite(str(out_dir / Path(r.path or "image.jpg").name), img)
    if out_dir is not None:
        print(f"saved to {out_dir}")
    if results.skipped:
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        for f, why in results.skipped:
            err.print(f"[yellow]skipped[/] {escape(f)}: {escape(why)}")
        err.print(f"{len(results.skipped)} of {len(results) + len(results.skipped)} images could not be read")
    return 0
