"""The rich tables that `libreyolo bench step` and `bench val` print (their JSON carries the same figures)."""

from __future__ import annotations

from typing import Any


def print_step_table(meta: dict[str, Any], results: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"bench step: {meta['model']} batch {meta['batch']} imgsz {meta['imgsz']} {meta['amp_dtype']} "
        f"on {meta['gpu']}"
    )
    cols = (
        "mode",
        "ms/step",
        "median ms",
        "min ms",
        "x eager",
        "captured",
        "kernels/step",
        "GPU busy (profiled)",
        "peak alloc GiB",
    )
    for c in cols:
        t.add_column(c, justify="right")
    for r in results:
        t.add_row(
            r["mode"],
            f"{r['mean_ms']:.1f}",
            f"{r['median_ms']:.1f}",
            f"{r['min_ms']:.1f}",
            f"{r['speedup_vs_eager']:.2f}" if r["speedup_vs_eager"] else "-",
            f"{r['captured_share']:.0%}" if r.get("captured_share") is not None else "-",
            f"{r.get('kernels_per_step', 0):.0f}",
            f"{r['gpu_busy_frac']:.0%}" if r.get("gpu_busy_frac") else "-",
            f"{r['peak_allocated_gb']:.2f}" if r["peak_allocated_gb"] is not None else "-",
        )
    c = Console()
    c.print(t)
    c.print(
        f"  ms/step: the {results[0]['steps']} timed steps back to back (whole cycles of {results[0]['accumulate']} "
        "micro-steps per optimizer step), which x eager compares; median and min: single steps"
    )
    for r in results:
        for note in r["notes"]:
            c.print(f"  {r['mode']}: {note}")
        if r.get("overlap_backward"):
            c.print(f"  {r['mode']}: each micro-step's backward ran beside the next forward (engine/overlap.py)")
        if "ddp_overhead" in r:
            c.print(f"  {r['mode']}: {r['ddp_overhead']:+.1%} step time against the same mode without DDP")
        if r.get("captured_ms") is not None:
            c.print(
                f"  {r['mode']}: captured graphs (forward + backward replays) {r['captured_ms']:.1f} ms of a mean "
                f"{r['captured_ms'] / r['captured_share']:.1f} ms step ({r['captured_share']:.0%}); the rest eager"
            )
        if r.get("per_phase"):
            c.print(f"  {r['mode']} kernels per phase: " + ", ".join(f"{k} {v:.0f}" for k, v in r["per_phase"].items()))
        if r.get("gpu_busy_frac") is not None:
            c.print(
                f"  {r['mode']} profiled window, per step: wall {r['profiled_wall_ms_per_step']:.1f} ms, GPU busy "
                f"{r['gpu_busy_ms_per_step']:.1f} ms "
                f"(union of kernel intervals; kernel durations sum to {r['kernel_time_sum_ms_per_step']:.1f} ms), "
                f"{r['copies_per_step']:.0f} copies/memsets {r['copy_time_ms_per_step']:.2f} ms"
            )


def print_val_table(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    m = r["meta"]
    t = Table(
        title=f"bench val: {m['model']} on {r['images']} images, batch {m['batch']}, imgsz {m['imgsz']}, "
        f"{m['amp_dtype']} on {m['gpu']}"
    )
    for c in ("stage", "seconds", "share", "img/s"):
        t.add_column(c, justify="right")
    total = r["stages"]["total_s"]
    for k, s in r["stages"]["seconds"].items():
        t.add_row(k, f"{s:.3f}", f"{s / max(total, 1e-9):.0%}", f"{r['images'] / s:.0f}" if s > 0 else "-")
    t.add_row("stages total", f"{total:.3f}", "", f"{r['stages']['img_s']:.0f}")
    e = r["end_to_end"]
    t.add_row("end to end", f"{e['seconds']:.3f}", "", f"{e['img_s']:.0f}")
    c = Console()
    c.print(t)
    ld = r["loader"]
    c.print(
        f"  loader alone: {ld['img_s']:.0f} img/s ({m['workers']} workers, first batch {ld['first_batch_s']:.2f} s); "
        f"end to end: {e['time_s']:.3f} s holding the caller + {e['eval_s']:.3f} s COCO evaluation; "
        f"{r['detections']:,} detections"
    )
    c.print(f"  mAP50 {r['metrics']['map50']:.4f}  mAP50-95 {r['metrics']['map']:.4f}")
