"""Rich tables for a profile.json: the end-of-window report and `libreyolo profile summary|phases|kernels`."""

from __future__ import annotations

import re
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

KERNEL_SORTS = {"ms": "ms_per_step", "pct": "pct_gpu", "count": "count_per_step", "mean": "mean_us", "name": "name"}


def _n(x: Any, digits: int = 1) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.{digits}f}" if isinstance(x, (int, float)) else str(x)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def console() -> Console:
    """Wide when piped (a log, CI, a test): kernel names are long and a table squeezed to 80 columns hides them."""
    return Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)


def _table(title: str, columns: list[str]) -> Table:
    t = Table(title=title, title_justify="left", box=None, padding=(0, 2), header_style="bold", show_edge=False)
    for i, c in enumerate(columns):
        # the name column folds; the figures never shrink to an ellipsis
        t.add_column(
            c, justify="left" if i == 0 else "right", overflow="fold", no_wrap=i > 0, min_width=24 if i == 0 else None
        )
    return t


def headline_table(p: dict[str, Any]) -> Table:
    h, m, w = p["headline"], p["meta"], p["window"]
    t = _table(
        f"{m['model']} on {m['device_name']} · batch {m['batch']} · {m['imgsz']} px · amp "
        f"{m['amp_dtype'] if m['amp'] else 'off'} · "
        f"workers {m['workers']} · {w['unsync_steps']}+{w['sync_steps']} steps after {w['warmup_steps']} warmup"
        # the steps the window discarded for the loader's queue (profiles written before it lack the field)
        + (f" (incl. {w['prefetch_batches']} for the loader's queue)" if w.get("prefetch_batches") else ""),
        ["figure", "value"],
    )
    rows = [
        ("step time (unsynchronised)", f"{_n(h['step_ms'])} ms"),
        ("images / s", _n(h["img_s"])),
        ("data wait", f"{_n(h['data_ms'])} ms ({_pct(h['data_frac'])})"),
    ]
    if m["device"].startswith("cuda"):  # a CPU run has no kernels, allocator calls or VRAM to show
        rows += [
            ("GPU utilization", _pct(h["utilization"])),
            ("kernels / step", _n(h["kernels_per_step"], 0)),
            ("mean kernel", f"{_n(h['mean_kernel_us'])} µs"),
            ("tensor-core share of kernel time", _pct(h["tensor_core_frac"])),
            ("cudaMalloc+cudaFree / step", _n(h["alloc_calls_per_step"])),
            (
                "peak VRAM allocated / reserved",
                "n/a"
                if h["peak_reserved_mb"] is None
                else f"{_n(h['peak_allocated_mb'], 0)} / {_n(h['peak_reserved_mb'], 0)} MB",
            ),
        ]
    for r in rows:
        t.add_row(*r)
    return t


def phases_table(p: dict[str, Any]) -> Table:
    # a column for the GPU time of captured submodule graphs only where there were any (profiles written before
    # it lack the field)
    split = any(r.get("replayed_gpu_ms") for r in p["phases"])
    cols = ["phase", "host", "GPU", *(["of it replayed"] if split else []), "synced", "share"]
    t = _table("phases, ms per step (host and GPU: first half; synced: second half)", cols)
    for r in p["phases"]:
        gpu = [_n(r["gpu_ms"], 2), *([_n(r.get("replayed_gpu_ms", 0.0), 2)] if split else [])]
        t.add_row(r["name"], _n(r["host_ms"], 2), *gpu, _n(r["synced_ms"], 2), _pct(r["share"]))
    return t


def select_kernels(
    p: dict[str, Any], top: int = 10, phase: str | None = None, grep: str | None = None, sort: str = "ms"
) -> list[dict[str, Any]]:
    """Kernel rows filtered by launching phase and a name regex; without --phase, rows of one name merge."""
    rows = [r for r in p["kernels"] if phase is None or r["phase"] == phase]
    if grep:
        rx = re.compile(grep, re.I)
        rows = [r for r in rows if rx.search(r["name"])]
    if phase is None:
        merged: dict[str, dict[str, Any]] = {}
        for r in rows:
            m = merged.setdefault(
                r["name"], {**r, "ms_per_step": 0.0, "pct_gpu": 0.0, "count_per_step": 0.0, "phase": set()}
            )
            for k in ("ms_per_step", "pct_gpu", "count_per_step"):
                m[k] += r[k]
            m["phase"].add(r["phase"])
        for m in merged.values():
            m["mean_us"] = 1000 * m["ms_per_step"] / m["count_per_step"] if m["count_per_step"] else 0.0
            m["phase"] = ",".join(sorted(m["phase"]))
        rows = list(merged.values())
    key = KERNEL_SORTS[sort]
    rows.sort(key=(lambda r: r[key]) if key == "name" else (lambda r: -r[key]))
    return rows[:top] if top > 0 else rows


def kernels_table(rows: list[dict[str, Any]], title: str = "GPU kernels") -> Table:
    t = _table(title, ["kernel", "category", "phase", "ms/step", "% GPU", "n/step", "mean µs", "TC"])
    for r in rows:
        name = r["name"] if len(r["name"]) <= 90 else r["name"][:87] + "..."
        t.add_row(
            name,
            r["category"],
            r["phase"],
            _n(r["ms_per_step"], 3),
            _n(r["pct_gpu"]),
            _n(r["count_per_step"]),
            _n(r["mean_us"]),
            "yes" if r["tensor_core"] else "",
        )
    return t


def cpu_ops_table(p: dict[str, Any], top: int = 10) -> Table:
    t = _table("CPU ops by self time", ["op", "calls/step", "self ms/step", "total ms/step"])
    for r in p["cpu_ops"][:top]:
        t.add_row(r["name"], _n(r["calls_per_step"]), _n(r["self_ms_per_step"], 3), _n(r["total_ms_per_step"], 3))
    return t


def verdict_lines(p: dict[str, Any]) -> list[str]:
    v = p["verdict"]
    return [f"[bold]verdict: {v['name']}[/]", v["why"], *[f"  {i}. {lever}" for i, lever in enumerate(v["levers"], 1)]]


def print_report(p: dict[str, Any], out: Console | None = None, verdict: bool = False) -> None:
    """The end-of-window report; the `profile` event that follows prints the verdict (verdict=True adds it here)."""
    c = out or console()
    c.print(headline_table(p))
    c.print(phases_table(p))
    rows = select_kernels(p, top=5)
    if rows:
        c.print(kernels_table(rows, "top GPU kernels"))
    else:
        c.print(cpu_ops_table(p, top=5))
    if verdict:
        for line in verdict_lines(p):
            c.print(line)
