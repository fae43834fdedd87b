"""Every size of a family, our training step beside LibreYOLO 1.6's and Ultralytics' on the same batch, in one call.

    python3 benchmarks/sizes_vs.py --ly16 DIR --ul DIR --out rows.jsonl --budget 540 \\
        yolo9:t:8 yolo9:s:8 yolox:n:32 rtdetr:r18:8 ...          # family:size:batch, run in this order
    python3 benchmarks/sizes_vs.py --table rows.jsonl           # the markdown rows of docs/performance.md

Each spec runs three programs one after another, each in a process of its own: `libreyolo bench step` (ours: eager
and the mode `cuda_graph=auto` picks, `full`, or `graph` for RT-DETR), `benchmarks/libreyolo16_step.py` (1.6: eager
and its `cuda_graph=True`; --ly16 is the folder 1.6 is installed in) and, for YOLOv9, `benchmarks/ultralytics_step.py`
(Ultralytics' `yolov9<size>.yaml`; --ul is a folder holding the ultralytics package, put first on the path, since
the project does not depend on it). Every program's JSON lines are appended to --out as they come, tagged with the
library and the spec, so a call cut short keeps what it measured; a program that fails leaves its exit status and
the last 20,000 characters of its stderr (a native crash at exit prints a long stack below the Python error). Once
less than 20 s of --budget is left, the rest is written as skipped. --libs leaves libraries out (`ours` alone needs
neither folder)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import libreyolo16_families as families16  # beside this script: each family's model prefix and sizes, smallest first
import torch

from libreyolo.engine.runners import graph_mode
from libreyolo.families import get_family

HERE = Path(__file__).resolve().parent
DETECTORS = ("yolo9", "yolox", "rtdetr")  # issue 49's detector families


def auto_mode(fam: str) -> str:
    """bench step's name for the mode cuda_graph=auto picks on one GPU, from the engine's own rule
    (engine/runners.py graph_mode)."""
    mode, _ = graph_mode("auto", get_family(fam), torch.device("cuda", 0), 1)
    return {"full": "full", True: "graph", False: "eager"}[mode]


def commands(spec: str, a: argparse.Namespace) -> list[tuple[str, list[str], dict[str, str] | None]]:
    """(library, argv, environment) of each program that spec runs, in order."""
    fam, size, batch = spec.split(":")
    if fam not in DETECTORS:
        raise SystemExit(f"{spec}: family {fam!r} is not one of {', '.join(DETECTORS)}")
    steps = ["--steps", str(a.steps), "--warmup", str(a.warmup), "--device", a.device]
    out: list[tuple[str, list[str], dict[str, str] | None]] = []
    if "ours" in a.libs:
        argv = ["libreyolo", "bench", "step", f"model={families16.FAMILIES[fam].prefix}{size}", f"batch={batch}"]
        argv += [f"imgsz={a.imgsz}", f"modes=eager,{auto_mode(fam)}", f"steps={a.steps}", f"warmup={a.warmup}"]
        argv += ["kernels=false"]
        out.append(("ours", [*argv, "json=true", f"device={a.device.removeprefix('cuda:')}"], None))
    if "ly16" in a.libs:
        argv = [sys.executable, str(HERE / "libreyolo16_step.py"), "--ly16", str(a.ly16), "--family", fam]
        argv += ["--size", size, "--batch", batch, "--imgsz", str(a.imgsz), "--modes", "eager,graph", *steps]
        out.append(("ly16", argv, None))
    if "ultralytics" in a.libs and fam == "yolo9":
        argv = [sys.executable, str(HERE / "ultralytics_step.py"), "--model", f"yolov9{size}.yaml", "--batch", batch]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(a.ul), os.environ.get("PYTHONPATH")) if p)}
        out.append(("ultralytics", [*argv, "--imgsz", str(a.imgsz), *steps], env))
    return out


def measure(a: argparse.Namespace) -> None:
    start = time.monotonic()
    with open(a.out, "a") as rows:

        def emit(row: dict) -> None:
            rows.write(json.dumps(row) + "\n")
            rows.flush()

        for spec in a.specs:
            for lib, argv, env in commands(spec, a):
                left = a.budget - (time.monotonic() - start)
                if left < 20:
                    emit({"lib": lib, "spec": spec, "skipped": "the budget ran out"})
                    continue
                t0 = time.monotonic()
                try:
                    p = subprocess.run(argv, capture_output=True, text=True, timeout=min(a.limit, left), env=env)
                except subprocess.TimeoutExpired:
                    emit({"lib": lib, "spec": spec, "error": f"no result in {min(a.limit, left):.0f} s"})
                    continue
                lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
                for ln in lines:
                    emit({"lib": lib, "spec": spec, "s": round(time.monotonic() - t0, 1), "row": json.loads(ln)})
                if p.returncode or not lines:
                    emit({"lib": lib, "spec": spec, "rc": p.returncode, "error": p.stderr[-20000:]})
                print(f"{lib} {spec}: exit {p.returncode}, {time.monotonic() - t0:.1f} s", flush=True)


def table(path: Path, date: str, hardware: str) -> list[str]:
    """The markdown rows: model, params (1.6's count), batch, ours eager, ours (auto), 1.6 eager, 1.6 graph,
    Ultralytics, 1.6's faster over ours, Ultralytics over ours (ms per step: each program's timed steps back to back,
    whole accumulation cycles, its mean_ms; '-' where not measured)."""
    got: dict[tuple[str, str, int], dict[str, float]] = {}
    params: dict[tuple[str, str], int] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if "row" not in r or ("mean_ms" not in r["row"] and "results" not in r["row"]):
            continue  # skipped, failed, or a mode the program could not run (1.6's graph on a CPU)
        fam, size, batch = r["spec"].split(":")
        d, x = got.setdefault((fam, size, int(batch)), {}), r["row"]
        if r["lib"] == "ours":
            d.update({f"ours {m['mode']}": m["mean_ms"] for m in x["results"]})
        elif r["lib"] == "ly16":
            d[f"ly16 {x['mode']}"] = x["mean_ms"]
            params[(fam, size)] = x["params"]
        else:
            d["ultralytics"] = x["mean_ms"]

    def order(key: tuple[str, str, int]) -> tuple[int, int, int]:
        fam, size, batch = key
        return DETECTORS.index(fam), batch, families16.FAMILIES[fam].sizes.index(size)

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    out = []
    for key in sorted(got, key=order):
        fam, size, batch = key
        d = got[key]
        ours = d.get(f"ours {auto_mode(fam)}")
        ly16 = [d[m] for m in ("ly16 eager", "ly16 graph") if m in d]
        p = params.get((fam, size))
        cells = [
            f"{families16.FAMILIES[fam].prefix}{size}",
            f"{p / 1e6:.1f}M" if p else "-",
            str(batch),
            ms(d.get("ours eager")),
            ms(ours),
            ms(d.get("ly16 eager")),
            ms(d.get("ly16 graph")),
            ms(d.get("ultralytics")),
            f"{min(ly16) / ours:.1f}x" if ly16 and ours else "-",
            f"{d['ultralytics'] / ours:.1f}x" if "ultralytics" in d and ours else "-",
            date,
            hardware,
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("specs", nargs="*", help="family:size:batch (yolo9:t:8, yolox:x:32, rtdetr:r50:8)")
    ap.add_argument("--ly16", type=Path, default=os.environ.get("LIBREYOLO16_DIR"), help="LibreYOLO 1.6's folder")
    ap.add_argument("--ul", type=Path, help="a folder holding the ultralytics package (pip install --target)")
    ap.add_argument("--libs", default="ours,ly16,ultralytics", help="which libraries to time")
    ap.add_argument("--out", type=Path, default=Path("sizes_vs.jsonl"))
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for the whole call")
    ap.add_argument("--limit", type=float, default=150.0, help="seconds for one program")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=6)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--table", type=Path, help="print the markdown rows of a rows file instead of measuring")
    ap.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    ap.add_argument("--hardware", default="H200")
    a = ap.parse_args(argv)
    if a.table:
        print("\n".join(table(a.table, a.date, a.hardware)))
        return
    a.libs = set(a.libs.split(","))
    for lib, folder in (("ly16", a.ly16), ("ultralytics", a.ul)):
        if lib in a.libs and (folder is None or not folder.is_dir()):
            raise SystemExit(f"--libs has {lib} but its folder ({folder}) is not there: pass it, or leave {lib} out")
    measure(a)


if __name__ == "__main__":
    main()
