"""`libreyolo profile run`: profile-only runs (as many steps as the window needs), repeats, and `--try`.

A profile run is an ordinary training run with profile=true, no_aug_epochs=0 (epoch 0 is measured with the
real augmenting loader) and val=false, that ends with status "profiled" once the window is measured: no
epoch-end "finished" checkpoint is written for a run that trained 25 steps. Its pictures are off unless asked for
(plots=true): the window is a few dozen steps at a run's start, just when the plot writer's children load
matplotlib and draw labels.jpg and the first batches, CPU work a long run does once (on the 2-core CPU machine two
such children took 15-25% of a CPU each through a profile trial's first seconds)."""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from libreyolo import events as ev
from libreyolo.config import TrainConfig
from libreyolo.engine.loop import RunLoop
from libreyolo.errors import LibreYOLOError
from libreyolo.profiler.artifacts import write_json
from libreyolo.profiler.schema import load_profile
from libreyolo.profiler.verdict import FREE_PER_STEP, MEMORY
from libreyolo.runs import increment_run_dir

REPEAT_SCHEMA = "libreyolo.profile_repeat/v1"
TRY_SCHEMA = "libreyolo.profile_try/v1"
PROFILE_RUN_KEYS = {"profile": True, "no_aug_epochs": 0, "val": False}


class ProfileRunError(LibreYOLOError, RuntimeError):
    """A profile run that ended without a report."""


class _StopWhenProfiled:
    """A callback: once the `profile` event is out, end the run after the current step."""

    def __init__(self) -> None:
        self.trainer: RunLoop | None = None

    def __call__(self, e: ev.Event) -> None:
        if e.type == "profile" and self.trainer is not None:
            self.trainer.stop_requested = "profiled"


def run_keys(overrides: dict[str, Any], project: Path, name: str, exist_ok: bool) -> dict[str, Any]:
    """A profile run's training keys: the user's, with PROFILE_RUN_KEYS over them and plots off unless given."""
    keys = {"plots": False, "model": "LibreYOLO9t", **overrides, **PROFILE_RUN_KEYS}
    return {**keys, "project": str(project), "name": name, "exist_ok": exist_ok}


def profile_once(overrides: dict[str, Any], project: Path, name: str, exist_ok: bool = False) -> dict[str, Any]:
    """Train with profile=true until the window is measured; return the validated profile.json."""
    from libreyolo import LibreYOLO
    from libreyolo.engine.trainer import Trainer
    from libreyolo.profiler import attach

    kwargs = run_keys(overrides, project, name, exist_ok)
    model = LibreYOLO(kwargs["model"], pretrained=kwargs.pop("pretrained", True))
    cfg = TrainConfig.from_overrides(kwargs, family=model.family)
    stop = _StopWhenProfiled()
    cfg.callbacks = [*cfg.callbacks, stop]
    trainer = Trainer(model, cfg, [attach])
    stop.trainer = trainer
    try:
        trainer.train()
        run_dir = trainer.s.run_dir
    finally:
        del trainer, stop  # persistent loader workers and CUDA memory go before the next trial starts
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    path = run_dir / "profile.json"
    if not path.is_file():
        raise ProfileRunError(
            f"{run_dir}: the run ended before the profile window was measured (see the warning above and "
            f"{run_dir / 'events.jsonl'}); lower --warmup/--steps or use a larger dataset"
        )
    return load_profile(path)


def fresh_trial(overrides: dict[str, Any], project: Path, name: str) -> tuple[dict[str, Any], int]:
    """profile_once in a new Python process (libreyolo/cli/profile_trial.py); -> (profile.json, that process's pid).

    Its output goes where this process's stdout goes (stderr under --json); it imports the libreyolo this process
    runs, whatever the working directory."""
    import libreyolo

    env = dict(os.environ)
    root = str(Path(libreyolo.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "libreyolo.cli.profile_trial", json.dumps(overrides), str(project), name]
    try:
        out: Any = sys.stdout if sys.stdout.fileno() >= 0 else None
    except (AttributeError, OSError, ValueError):  # a stdout without a file descriptor (captured): relay the text
        out = None
    sys.stdout.flush()  # what this process printed so far comes before the trial's output
    proc = subprocess.Popen(
        cmd, env=env, stdout=out if out is not None else subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    text, _ = proc.communicate()
    if out is None and text:
        sys.stdout.write(text)
    if proc.returncode != 0:
        raise ProfileRunError(
            f"trial {project / name} ended with exit status {proc.returncode} (its output is above): no report from it"
        )
    return load_profile(project / name / "profile.json"), proc.pid


def _trial(p: dict[str, Any], run_dir: Path, pid: int) -> dict[str, Any]:
    h = p["headline"]
    return {
        "run_dir": str(run_dir),
        "pid": pid,
        "verdict": p["verdict"]["name"],
        "why": p["verdict"]["why"],
        "step_ms": h["step_ms"],
        "img_s": h["img_s"],
        "utilization": h["utilization"],
        "data_frac": h["data_frac"],
        "try": p["verdict"]["try"],
        "lever": p["verdict"]["levers"][0] if p["verdict"]["levers"] else None,
        "evidence": p["verdict"].get("evidence", {}),
        "captures_in_window": int(h.get("captures_in_window") or 0),
        "window_moved_past": list(h.get("window_moved_past") or []),
    }


def _stats(xs: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(xs),
        "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "min": min(xs),
        "median": statistics.median(xs),
        "max": max(xs),
    }


def trials(overrides: dict[str, Any], base: Path, repeat: int, prefix: str, fresh: bool = True) -> dict[str, Any]:
    """repeat == 1: one run in `base`, in this process; else prefix_1 ... prefix_N inside it, each in a fresh
    process (nothing one trial warmed up or left behind helps or hurts the next), or with fresh=False one after
    another in this one (a new run and window each, on the same CUDA context and cuDNN autotuning cache). Mean,
    spread (min / median / max), how many trials gave each verdict, and `mixed` when they do not all agree."""
    out = []
    for k in range(1, repeat + 1):
        if repeat == 1 and prefix == "prof":  # a single profile is the run folder itself
            project, name = base.parent, base.name
        else:
            project, name = base, prefix if repeat == 1 else f"{prefix}_{k}"
        if repeat > 1 and fresh:
            p, pid = fresh_trial(overrides, project, name)
        else:
            p, pid = profile_once(overrides, project, name, exist_ok=True), os.getpid()
        out.append(_trial(p, project / name, pid))
    return summarize(out, fresh)


def summarize(out: list[dict[str, Any]], fresh: bool = True) -> dict[str, Any]:
    """The repeat record of trials (see `trials`)."""
    verdicts = Counter(t["verdict"] for t in out)
    return {
        "schema": REPEAT_SCHEMA,
        "process": "fresh per trial" if len(out) > 1 and fresh else "one process",
        "trials": out,
        "step_ms": _stats([t["step_ms"] for t in out]),
        "img_s": _stats([t["img_s"] for t in out]),
        "verdict": out[0]["verdict"] if len(verdicts) == 1 else "mixed",
        # most common first: "compute 5/5", "compute 4/5, host / launch 1/5"
        "verdicts": dict(verdicts.most_common()),
    }


def verdict_counts(result: dict[str, Any]) -> str:
    """'compute 5/5' or 'compute 3/5, host / launch 2/5': how many of the N trials gave each verdict."""
    n = len(result["trials"])
    return ", ".join(f"{name} {count}/{n}" for name, count in result["verdicts"].items())


def run_profile(
    overrides: dict[str, Any], project: str, name: str, repeat: int = 1, try_lever: bool = False, fresh: bool = True
) -> dict[str, Any]:
    base = increment_run_dir(project, name, exist_ok=False)
    before = trials(overrides, base, repeat, "prof", fresh)
    result: dict[str, Any] = {**before, "run_dir": str(base), "repeat": None, "try": None}
    if repeat > 1:
        write_json(base / "profile_repeat.json", before)
        result["repeat"] = str(base / "profile_repeat.json")
    if try_lever:
        result["try"] = try_first_lever(overrides, base, repeat, before, fresh)
    return result


NO_GAIN = 1.02  # an after/before img/s ratio below this is reported as "did not help"


def lever_refusal(verdict: str, lever: dict[str, Any] | None, evidence: dict[str, Any], captures: int) -> str | None:
    """Why `--try` will not apply this lever, or None when the evidence is strong enough to measure it.

    A smaller batch is tried only after real churn (cudaFree calls, allocator retries) or a recovered OOM; no
    lever is tried from a window that held a CUDA graph capture, which is not a clean "before"."""
    if lever is None:
        return f"verdict {verdict!r} has no lever that a setting can try here"
    if captures:
        return (
            f"the measured window held {captures} CUDA graph capture(s), so it is not a clean 'before' to compare "
            "with; rerun with a larger --warmup"
        )
    if verdict == MEMORY and "batch" in lever:
        frees = float(evidence.get("free_per_step") or 0.0)
        retries, ooms = int(evidence.get("alloc_retries") or 0), int(evidence.get("ooms") or 0)
        if frees < FREE_PER_STEP and retries == 0 and ooms == 0:
            return (
                f"a smaller batch is tried only after allocator churn or an OOM; this window had {frees:.1f} cudaFree "
                f"per step, {retries} retries and {ooms} OOMs"
            )
    return None


def try_outcome(before_img_s: float, after_img_s: float) -> tuple[float | None, str | None]:
    """(after/before img/s, a plain sentence when the lever did not help)."""
    if not before_img_s:
        return None, None
    speedup = after_img_s / before_img_s
    if speedup < NO_GAIN:
        return speedup, (
            f"the lever did not help: {before_img_s:.1f} img/s before, {after_img_s:.1f} after ({speedup:.2f}x)"
        )
    return speedup, None


def try_first_lever(
    overrides: dict[str, Any], base: Path, repeat: int, before: dict[str, Any], fresh: bool = True
) -> dict[str, Any]:
    """Apply the verdict's first lever when its evidence is strong, measure again under the same settings and
    window length otherwise, and compare."""
    common = Counter(t["verdict"] for t in before["trials"]).most_common(1)[0][0]
    source = next(t for t in before["trials"] if t["verdict"] == common)
    lever = source["try"]
    record: dict[str, Any] = {
        "schema": TRY_SCHEMA,
        "verdict": common,
        "lever": lever,
        "lever_text": source["lever"],
        "before": {"step_ms": before["step_ms"], "img_s": before["img_s"], "verdict": before["verdict"]},
    }
    refusal = lever_refusal(
        common, lever, source.get("evidence", {}), max(t.get("captures_in_window", 0) for t in before["trials"])
    )
    if refusal is not None:
        record.update(after=None, speedup=None, note=refusal)
    else:
        assert lever is not None
        after = trials({**overrides, **lever}, base, repeat, "try", fresh)
        speedup, note = try_outcome(before["img_s"]["mean"], after["img_s"]["mean"])
        captured = max(t.get("captures_in_window", 0) for t in after["trials"])
        if captured:
            note = (note + "; " if note else "") + (
                f"the 'after' window held {captured} CUDA graph capture(s): the comparison is not clean"
            )
        record.update(
            after={
                "step_ms": after["step_ms"],
                "img_s": after["img_s"],
                "verdict": after["verdict"],
                "trials": after["trials"],
            },
            speedup=speedup,
            note=note,
        )
    write_json(base / "profile_try.json", record)
    record["path"] = str(base / "profile_try.json")
    return record
