"""libreyolo predict model=... source=img.jpg [conf=0.25 iou=0.7 imgsz= device= multi_label= save=false json=false]

source= an image, a video, a folder of both, a glob, a camera index or a stream URL (libreyolo/sources). Results are
predicted and saved one frame at a time (libreyolo/sources/outputs.py writes what save, save_txt and save_json ask
for); a progress bar on stderr counts the frames of files. An image that cannot be read is skipped and named on
stderr; the others are predicted. The exit status is 0 when at least one image was predicted, 2 (an error) when
none could be read."""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from libreyolo.cli.args import flag, parse_kv
from libreyolo.cli.help import show_help
from libreyolo.runs import increment_run_dir

KEYS = {"model", "imgsz", "device", "conf", "iou", "max_det", "multi_label", "project", "name"}
SWITCHES = {
    "save": "write annotated images, and each video as an .mp4 of its frame rate and size, to runs/predict/exp",
    "save_txt": "write YOLO labels per image and per video frame to runs/predict/exp/labels/",
    "save_conf": "with save_txt, each line ends with the detection's confidence",
    "save_json": "write COCO results (image_id, category_id, bbox x,y,w,h, score) to runs/predict/exp/predictions.json",
    "json": "print detections as JSON lines",
}


def run(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        return show_help(
            "predict",
            KEYS,
            {"source": "image, video, folder of both, glob, camera index (0) or rtsp:// / http:// URL", **SWITCHES},
            defaults={"conf": 0.25, "project": "runs/predict"},
        )
    kw = parse_kv(argv, KEYS, {"source": str, **dict.fromkeys(SWITCHES, flag)}, command="predict")
    from libreyolo import LibreYOLO
    from libreyolo.errors import ConfigError
    from libreyolo.predict import UnreadableImageWarning
    from libreyolo.sources import open_source
    from libreyolo.sources.outputs import PredictWriter

    if "source" not in kw:
        raise ConfigError("predict needs source=PATH (an image, a video, a folder, a glob, a camera index or a URL)")
    model = LibreYOLO(kw.pop("model", "LibreYOLO9t"))
    switches = {k: kw.pop(k, False) for k in SWITCHES}
    as_json = switches.pop("json")
    saving = switches["save"] or switches["save_txt"] or switches["save_json"]
    out_dir = increment_run_dir(kw.pop("project", "runs/predict"), kw.pop("name", "exp"), False) if saving else None
    kw.setdefault("conf", 0.25)
    source = open_source(kw.pop("source"))
    writer = PredictWriter(out_dir, source, **switches) if out_dir is not None else None
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    with warnings.catch_warnings():  # the skipped files are listed once, at the end
        warnings.simplefilter("ignore", UnreadableImageWarning)
        # any other warning (a truncated image, predicted on what could be decoded): one line naming the file
        warnings.showwarning = lambda message, *a, **k: err.print(f"[yellow]warning:[/] {escape(str(message))}")
        results = model.predict(source, stream=True, **kw)
        try:
            done = _consume(results, source, writer, as_json, err)
        finally:
            results.close()
            if writer is not None:
                writer.close()
    if out_dir is not None:
        print(f"saved to {out_dir}")
    if results.skipped:
        for f, why in results.skipped:
            err.print(f"[yellow]skipped[/] {escape(f)}: {escape(why)}")
        err.print(f"{len(results.skipped)} of {done + len(results.skipped)} images could not be read")
    return 0


def _consume(results: Any, source: Any, writer: Any, as_json: bool, err: Console) -> int:
    """Print (and save) each result as it comes, under a progress bar of the source's frames on a terminal when it
    has a known number (files; a camera or stream has none). -> how many results there were."""
    total = source.total if err.is_terminal else None
    columns = (TextColumn("predict"), BarColumn(), MofNCompleteColumn(), TextColumn("frames"), TimeRemainingColumn())
    counts: dict[str, int] = {}
    done = 0
    with Progress(*columns, console=err, disable=total is None, transient=True, redirect_stdout=False) as bar:
        # on one terminal the lines go above the bar; a redirected stdout gets them plain, the bar stays on stderr
        above = total is not None and sys.stdout.isatty()
        show = (lambda line: bar.console.print(line, markup=False, highlight=False)) if above else print
        task = bar.add_task("predict", total=total)
        for r in results:
            frame = writer.write(r) if writer is not None else None
            if frame is None and r.path in source.videos:  # nothing saved: count the frames here
                frame = counts[r.path] = counts.get(r.path, -1) + 1
            dets = r.to_list()
            if as_json:
                line = {"path": r.path, **({"frame": frame} if frame is not None else {}), "detections": dets}
                show(json.dumps(line))
            else:
                summary = ", ".join(f"{d['name']} {d['score']:.2f}" for d in dets) or "nothing"
                where = f"{r.path} frame {frame}" if frame is not None else r.path
                show(f"{where}: {summary}")
            done += 1
            bar.advance(task)
    return done
