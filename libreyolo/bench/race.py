"""libreyolo bench race: whole `libreyolo train` runs, launch to exit, one per cuda_graph mode, split into parts.

    libreyolo bench race data=DATA [modes=auto,full,true,false] [rounds=1] [train key=value ...]

Each run is a `libreyolo train` process of its own (its start, imports and CUDA context included), the modes
alternating within a round so that a machine's drift touches them alike. From a run's events: the start (launch to
the end of the first training step), the epochs' training parts and the seams between them, validation as it held
the loop, the training images per second over the training parts, the mode the run used and every capture,
re-capture, step-down and fallback, the peak reserved memory, the final mAP; and the mean GPU utilisation NVML
reported, sampled every 0.5 s from launch to exit (none without an NVIDIA driver)."""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from libreyolo.cli.args import flag, parse_kv
from libreyolo.errors import ConfigError

MODES = ("auto", "full", "true", "false")


def sample_gpu(stop: threading.Event, out: list[tuple[float, float]], period: float = 0.5) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # no NVIDIA driver: utilisation stays unknown
        return
    while not stop.wait(period):
        out.append((time.time(), float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)))


def epoch_spans(events: list[dict[str, Any]]) -> list[tuple[float, float, float | None]]:
    """Per epoch that reached its last step: (its epoch_start, its last step event, the next epoch_start or None)."""
    steps = [e for e in events if e["type"] == "step"]
    starts = [e for e in events if e["type"] == "epoch_start"]
    out = []
    for es in starts:
        last = [s["t"] for s in steps if s["epoch"] == es["epoch"] and s["step"] == s["steps"]]
        if last:
            after = [n["t"] for n in starts if n["epoch"] == es["epoch"] + 1]
            out.append((es["t"], last[-1], after[0] if after else None))
    return out


def parts(events: list[dict[str, Any]], launch: float, exit_t: float) -> dict[str, list[tuple[float, float]]]:
    """The run's wall-clock intervals by part: start (launch to the first step event), train (each epoch_start to
    its last step event), seams (an epoch's last step event to the next epoch_start), end (the last step event
    to exit)."""
    steps = [e for e in events if e["type"] == "step"]
    out: dict[str, list[tuple[float, float]]] = {"start": [], "train": [], "seams": [], "end": []}
    if not steps:
        return out
    out["start"].append((launch, steps[0]["t"]))
    for begin, last, after in epoch_spans(events):
        out["train"].append((max(begin, steps[0]["t"]), last))
        if after is not None:
            out["seams"].append((last, after))
    out["end"].append((steps[-1]["t"], exit_t))
    return out


def util_by_part(samples: list[tuple[float, float]], spans: dict[str, list[tuple[float, float]]]) -> dict[str, Any]:
    """Mean NVML utilisation of the samples taken inside each part. NVML's figure at a sample is the share of its
    own last averaging window (1/6 to 1 s) in which a kernel ran, so a short part borrows from its neighbours."""
    res: dict[str, float | None] = {}
    for name, ivs in spans.items():
        inside = [u for t, u in samples if any(a <= t < b for a, b in ivs)]
        res[name] = round(sum(inside) / len(inside), 1) if inside else None
    return res


def split(events: list[dict[str, Any]], launch: float, exit_t: float) -> dict[str, Any]:
    """The run's parts and decisions, read off its events."""
    by = lambda kind: [e for e in events if e["type"] == kind]  # noqa: E731
    steps, vals, start = by("step"), by("val"), by("run_start")[0]
    spans = epoch_spans(events)
    train = sum(last - begin for begin, last, _ in spans)
    seams = sum(after - last for _, last, after in spans if after is not None)
    ckpts = by("checkpoint")
    # images the training parts went through (a resumed run's first epoch may be partial: counted whole)
    trained = start["train_images"] * len(spans)
    return {
        "start_s": round(steps[0]["t"] - launch, 2) if steps else None,
        "run_start_s": round(start["t"] - launch, 2),
        "train_s": round(train, 2),
        "train_img_s": round(trained / train, 1) if train else None,
        "seams_s": round(seams, 2),
        "val_held_s": round(sum(v.get("held_s", v["time_s"]) for v in vals), 2),
        "val_device_s": round(sum(v["time_s"] for v in vals), 2),
        "val_eval_s": round(sum(v.get("eval_s", 0.0) for v in vals), 2),
        # epoch_start to the next epoch_start (the last: to its last step event): the first epochs' captures show here
        "epoch_s": [
            round((spans[i + 1][0] if i + 1 < len(spans) else last) - begin, 3)
            for i, (begin, last, _) in enumerate(spans)
        ],
        "end_s": round(exit_t - max(c["t"] for c in ckpts), 2) if ckpts else None,
        "epochs": len(by("epoch_end")),
        "graph": [f"{g['action']}: {g['reason']}" for g in by("graph")],
        "graph_actions": [g["action"] for g in by("graph")],
        "peak_reserved_gb": round(max(v["peak_reserved_mb"] for v in by("vram")) / 1024, 2) if by("vram") else None,
        "amp": [a["reason"] for a in by("amp")],
        "mode": start.get("cuda_graph_mode"),
        **{k: start[k] for k in ("accumulate", "steps_per_epoch", "optimizer", "batch", "model", "train_images")},
    }


def race(train_args: list[str], name: str, project: Path) -> dict[str, Any]:
    """One `libreyolo train` process with these key=value arguments, timed launch to exit. -> its figures."""
    cmd = [sys.executable, "-m", "libreyolo.cli.main", "train", *train_args, f"project={project}", f"name={name}"]
    cmd.append("exist_ok=true")
    run_dir = project / name
    for f in ("events.jsonl", "results.csv"):
        (run_dir / f).unlink(missing_ok=True)
    util: list[tuple[float, float]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_gpu, args=(stop, util), daemon=True)
    launch = time.time()
    sampler.start()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    exit_t = time.time()
    stop.set()
    sampler.join()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "stdout.txt").write_text(proc.stdout)
    if proc.returncode != 0 or not (run_dir / "events.jsonl").is_file():
        return {"name": name, "rc": proc.returncode, "wall_s": round(exit_t - launch, 2), "tail": proc.stdout[-2000:]}
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    results = run_dir / "results.csv"
    rows = list(csv.DictReader(results.read_text().splitlines())) if results.is_file() else []
    key = next((k for k in (rows[0] if rows else {}) if k.strip().startswith("metrics/mAP50-95")), None)
    return {
        "name": name,
        "rc": proc.returncode,
        "wall_s": round(exit_t - launch, 2),
        **split(events, launch, exit_t),
        "gpu_util_mean": round(sum(u for _, u in util) / len(util), 1) if util else None,
        "gpu_util_by_part": util_by_part(util, parts(events, launch, exit_t)),
        "map50_95": round(float(rows[-1][key]), 4) if rows and key else None,
        "map_per_epoch": [round(float(r[key]), 4) for r in rows] if key else [],
        "args": train_args,
        # a start that compiles torch from source (no bytecode cache; engine/bytecode.py's setup note) is ~2 s longer
        "torch_bytecode_cached": "has no bytecode cache" not in proc.stdout,
    }


def run(argv: list[str]) -> int:
    extra = {"modes": str, "rounds": int, "project": str, "out": str, "json": flag}
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        print("keys: modes (comma list of auto, full, true, false), rounds, project (runs' folder, default "
              "/tmp/libreyolo-race), out (append each run's JSON line to this file), json (print JSON lines); every "
              "other key=value goes to `libreyolo train`")  # fmt: skip
        return 0
    own = [a for a in argv if a.split("=", 1)[0] in extra]
    train_args = [a for a in argv if a not in own]
    kw = parse_kv(own, set(), extra, command="bench race")
    parse_kv(train_args)  # the training keys are checked here, with `libreyolo train`'s messages
    if any(a.split("=", 1)[0] in ("cuda_graph", "project", "name", "exist_ok") for a in train_args):
        raise ConfigError("bench race sets cuda_graph (use modes=), project (use project=), name and exist_ok itself")
    modes = [m.strip() for m in kw.get("modes", "auto").split(",")]
    if bad := [m for m in modes if m not in MODES]:
        raise ConfigError(f"modes={bad[0]!r}: choose from {', '.join(MODES)}")
    project = Path(kw.get("project", "/tmp/libreyolo-race")).expanduser()
    results = []
    for r in range(max(kw.get("rounds", 1), 1)):
        for m in modes:
            res = {"mode_asked": m, "round": r, **race([*train_args, f"cuda_graph={m}"], f"race-{m}-{r}", project)}
            results.append(res)
            if kw.get("out"):
                with open(kw["out"], "a") as f:
                    f.write(json.dumps(res) + "\n")
            if kw.get("json"):
                print(json.dumps(res), flush=True)
    if not kw.get("json"):
        _table(results)
    return 0 if all(r["rc"] == 0 for r in results) else 1


def _table(results: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    ok = [r for r in results if r["rc"] == 0]
    best = {
        m: statistics.median(r["wall_s"] for r in ok if r["mode_asked"] == m) for m in {r["mode_asked"] for r in ok}
    }
    fastest = min(best.values(), default=None)
    t = Table(title="bench race: launch to exit, one `libreyolo train` process per run")
    cols = ("mode", "used", "wall s", "x fastest", "start s", "train s", "train img/s", "val held s", "GPU util",
            "graphs", "peak reserved GiB", "mAP50-95")  # fmt: skip
    for c in cols:
        t.add_column(c, justify="left" if c in ("mode", "used", "graphs") else "right")
    for r in results:
        if r["rc"] != 0:
            t.add_row(r["mode_asked"], f"exit {r['rc']}", f"{r['wall_s']:.1f}", *["-"] * 9)
            continue
        acts = r["graph_actions"]
        graphs = ", ".join(f"{acts.count(a)} {a}" for a in dict.fromkeys(acts)) or "-"
        util = "-" if r["gpu_util_mean"] is None else f"{r['gpu_util_mean']:.0f}%"
        t.add_row(
            r["mode_asked"], str(r["mode"]), f"{r['wall_s']:.1f}",
            f"{r['wall_s'] / fastest:.2f}" if fastest else "-", f"{r['start_s']}", f"{r['train_s']:.1f}",
            f"{r['train_img_s']}", f"{r['val_held_s']:.1f}", util, graphs, f"{r['peak_reserved_gb']}",
            f"{r['map50_95']}",
        )  # fmt: skip
    c = Console()
    c.print(t)
    for r in results:
        if r["rc"] != 0:
            c.print(f"{r['name']} failed (exit {r['rc']}):\n{r['tail']}", markup=False)
        elif not r["torch_bytecode_cached"]:
            c.print(f"{r['name']}: torch had no bytecode cache, so this start includes compiling it")
