"""The training profiler: `profile=True` measures a window of real steps and names the one bottleneck.

`attach(trainer)` is the only entry the trainer calls (and only when profile=True): it hooks the loop's named
phases for the window, then writes timeline.html, profile_trace.json, profile_summary.json and profile.json
into the run folder, prints the report, emits a `profile` event and removes its hooks. docs/profiling.md
explains how to read the report."""

from __future__ import annotations

import json
import traceback

from libreyolo import events as ev
from libreyolo.engine.loop import RunLoop
from libreyolo.profiler.window import Plan, Window

__all__ = ["attach"]


def attach(trainer: RunLoop) -> Window | None:
    """Start the window on a set-up trainer; None (and one warning) where it cannot run."""
    s = trainer.s
    if s.world_size > 1:
        # each rank would profile its own share and disagree; one process gives the clean answer
        trainer.emit(
            ev.WarningEvent(
                f"profile=true is ignored under DDP (world_size={s.world_size}); profile one GPU instead (device=0)",
                code="profile",
            )
        )
        return None
    cfg = trainer.cfg
    window = Window(trainer, Plan.from_config(cfg.profile_warmup, cfg.profile_steps), _finish)
    s.closers.insert(0, window.close)  # a run that ends early stops the profiler and says why
    return window


def _finish(w: Window) -> None:
    """Report, or say why not: a failing report must not end the user's training."""
    try:
        _report(w)
    except Exception as e:  # noqa: BLE001 - any failure of the analysis becomes a warning, training goes on
        path = w.trainer.s.run_dir / "profile_error.txt"
        path.write_text(traceback.format_exc(), encoding="utf-8")
        w.trainer.emit(
            ev.WarningEvent(
                f"profile: the report failed ({type(e).__name__}: {e}); training continues. "
                f"Traceback in {path}; profile_trace.json holds the raw trace.",
                code="profile",
            )
        )


def _report(w: Window) -> None:
    from libreyolo.profiler.analysis import slice_trace
    from libreyolo.profiler.artifacts import write_artifacts
    from libreyolo.profiler.report import print_report
    from libreyolo.profiler.result import ARTIFACTS, build_profile, run_meta

    tr = w.trainer
    run_dir = tr.s.run_dir
    trace_path = run_dir / ARTIFACTS["trace"]
    w.prof.export_chrome_trace(str(trace_path))
    with open(trace_path, encoding="utf-8") as f:
        trace = slice_trace(json.load(f))
    # the loader's queue is what the window discarded after its warmup (profiler/prefetch.py): the verdict's why
    # says so, and profile.json keeps its depth beside the window's other counts
    meta = run_meta(tr)
    if w.queue.batches:
        meta["loader_queue"] = w.queue.describe()
        meta["loader_drain"] = {"steps": w.drain_steps, "waited": w.drain_waited, "waits_ms": w.drain_waits_ms}
    if len(w.cache_fill) == 2 and w.cache_fill[0] is not None and w.cache_fill[1] is not None:
        (start, n), (end, _) = w.cache_fill
        meta["image_cache"] = {"images": n, "held_at_start": start, "held_at_end": end}
    profile = build_profile(w, trace, meta)
    profile["window"]["prefetch_batches"] = w.queue.batches
    paths = write_artifacts(run_dir, profile, trace)
    if tr.s.is_main:
        print_report(profile)
    v, h = profile["verdict"], profile["headline"]
    tr.emit(
        ev.Profile(
            verdict=v["name"],
            why=v["why"],
            levers=v["levers"],
            step_ms=h["step_ms"],
            img_s=h["img_s"],
            utilization=h["utilization"],
            phases={p["name"]: p["synced_ms"] for p in profile["phases"]},
            artifacts=paths,
        )
    )
