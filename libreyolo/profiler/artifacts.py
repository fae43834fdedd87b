"""Write the four artifacts: timeline.html, profile_trace.json (written by torch.profiler), profile_summary.json,
profile.json. The timeline is the package's template (timeline.html/.js/.css, package data) with the data
inlined as JSON, so the one file opens offline: no CDN, no network."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from libreyolo.atomic import write_text
from libreyolo.profiler.analysis import ANNOTATION, Trace, depths, kernel_category, kernel_phases
from libreyolo.profiler.result import ARTIFACTS, summary_from_profile

MAX_CPU_OPS = 60_000  # a browser stays fluid below this; the shortest ops go first (the Chrome trace keeps all)
MAX_DEPTH = 8


def _template(name: str) -> str:
    return resources.files("libreyolo.profiler").joinpath(name).read_text(encoding="utf-8")


def write_json(path: Path, data: Any) -> None:
    """Atomic: a reader (the console, another `profile` command) never sees half a file."""
    write_text(path, json.dumps(data, indent=1, default=float) + "\n")


class _Builder:
    def __init__(self, t0: float):
        self.t0, self.lanes, self.events, self.names, self._idx = t0, [], [], [], {}

    def lane(self, name: str, group: str) -> int:
        self.lanes.append({"name": name, "group": group, "rows": 1})
        return len(self.lanes) - 1

    def add(self, lane: int, row: int, ts: float, dur: float, name: str, cat: str) -> None:
        i = self._idx.setdefault(name, len(self.names))
        if i == len(self.names):
            self.names.append(name)
        self.lanes[lane]["rows"] = max(self.lanes[lane]["rows"], row + 1)
        self.events.append([lane, row, round(ts - self.t0, 3), round(max(dur, 0.0), 3), i, cat])


def timeline_data(t: Trace, profile: dict[str, Any]) -> dict[str, Any]:
    """Lanes: steps and phases on the host, phases as the GPU ran them, CPU ops per thread (nested rows),
    kernels per stream, memcpy/memset. Times in µs from the window's first segment."""
    b = _Builder(t.segments[0][0] if t.segments else 0.0)
    host = b.lane("phases · CPU", "phases")
    for e in t.steps:
        b.add(host, 0, float(e["ts"]), float(e["dur"]), "step", "step")
    for e in t.phases:
        name = e["name"][len(ANNOTATION) :]
        b.add(host, 1, float(e["ts"]), float(e["dur"]), name, name)
    if t.kernels:
        gpu_phase = b.lane("phases · GPU", "phases")
        spans: dict[int, list[float]] = {}
        for k, ph in zip(t.kernels, kernel_phases(t)):
            if ph is not None:
                s, e = float(k["ts"]), float(k["ts"]) + float(k["dur"])
                span = spans.setdefault(ph, [s, e])
                span[0], span[1] = min(span[0], s), max(span[1], e)
        for ph, (s, e) in spans.items():
            name = t.phases[ph]["name"][len(ANNOTATION) :]
            b.add(gpu_phase, 0, s, e - s, name, name)
    ops = sorted(t.cpu_ops, key=lambda o: -float(o["dur"]))[:MAX_CPU_OPS]
    depth = depths(ops)
    threads: dict[Any, int] = {}
    for o, d in zip(ops, depth):
        if d >= MAX_DEPTH:
            continue
        key = (o.get("pid"), o.get("tid"))
        if key not in threads:
            threads[key] = b.lane(f"CPU ops · thread {o.get('tid')}", "cpu")
        b.add(threads[key], d, float(o["ts"]), float(o["dur"]), o["name"], "cpu_op")
    streams: dict[Any, int] = {}
    for k in t.kernels:
        stream = (k.get("args") or {}).get("stream", k.get("tid"))
        if stream not in streams:
            streams[stream] = b.lane(f"GPU kernels · stream {stream}", "gpu")
        b.add(streams[stream], 0, float(k["ts"]), float(k["dur"]), k["name"], kernel_category(k["name"]))
    if t.copies:
        copies = b.lane("memcpy / memset", "gpu")
        for c in t.copies:
            b.add(copies, 0, float(c["ts"]), float(c["dur"]), c["name"], kernel_category(c["name"], c.get("cat", "")))
    return {
        "lanes": b.lanes,
        "events": b.events,
        "names": b.names,
        "segments": [[round(s - b.t0, 3), round(e - b.t0, 3)] for s, e in t.segments],
        "verdict": profile["verdict"],
        "headline": profile["headline"],
        "meta": profile["meta"],
        "window": profile["window"],
        "phases": profile["phases"],
        "kernels": profile["kernels"][:15],
        "cpu_ops": profile["cpu_ops"][:15],
    }


def render_timeline(data: dict[str, Any]) -> str:
    # "</" inside a <script> element would end it early; JSON allows the escaped form
    payload = json.dumps(data, separators=(",", ":"), default=float).replace("</", "<\\/")
    html = _template("timeline.html")
    for marker, text in (
        ("/*@TIMELINE_CSS@*/", _template("timeline.css")),
        ("/*@TIMELINE_JS@*/", _template("timeline.js")),
        ("@TIMELINE_DATA@", payload),
    ):
        if marker not in html:
            raise RuntimeError(
                f"libreyolo/profiler/timeline.html lacks the {marker} marker; the package data is damaged, reinstall "
                "libreyolo"
            )
        html = html.replace(marker, text, 1)
    return html


def write_artifacts(run_dir: Path, profile: dict[str, Any], trace: Trace) -> dict[str, str]:
    """Write everything but the Chrome trace (already there); return name -> absolute path."""
    (run_dir / ARTIFACTS["timeline"]).write_text(render_timeline(timeline_data(trace, profile)), encoding="utf-8")
    write_json(run_dir / ARTIFACTS["summary"], summary_from_profile(profile))
    write_json(run_dir / ARTIFACTS["profile"], profile)
    return {k: str((run_dir / v).resolve()) for k, v in ARTIFACTS.items()}
