"""The shapes of profile.json (libreyolo.profile/v1) and profile_summary.json, checked field by field.

`profile summary|phases|kernels` read files from other machines and older versions: a bad file gets an error
naming the file, the field and what was expected, never a KeyError deep inside a table."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from libreyolo.errors import LibreYOLOError
from libreyolo.profiler.result import SCHEMA, SUMMARY_SCHEMA

NUM, INT, STR, BOOL = "number", "integer", "string", "boolean"
OPT_NUM = (NUM, None)

_META = {
    "model": STR,
    "data": STR,
    "run_dir": STR,
    "device": STR,
    "device_name": STR,
    "batch": INT,
    "imgsz": INT,
    "amp": BOOL,
    "amp_dtype": STR,
    "workers": INT,
    "accumulate": INT,
    "cuda_graph": STR,
    "cache": STR,
    "channels_last": BOOL,
    "cpus": INT,
    "torch": STR,
    "libreyolo": STR,
}
_WINDOW = {
    k: INT
    for k in (
        "requested_warmup",
        "requested_steps",
        "accumulate",
        "warmup_steps",
        "unsync_steps",
        "sync_steps",
        "segments",
        "traced_steps",
        "steps_seen",
    )
}
_HEADLINE = {
    "step_ms": NUM,
    "data_ms": NUM,
    "data_frac": NUM,
    "img_s": NUM,
    "utilization": OPT_NUM,
    "gpu_busy_ms_per_step": NUM,
    "kernels_per_step": NUM,
    "mean_kernel_us": NUM,
    "tensor_core_frac": NUM,
    "malloc_per_step": NUM,
    "free_per_step": NUM,
    "alloc_calls_per_step": NUM,
    "alloc_retries": INT,
    "peak_allocated_mb": OPT_NUM,
    "peak_reserved_mb": OPT_NUM,
    "total_mb": OPT_NUM,
    "vram_frac": OPT_NUM,
    "synced_step_ms": NUM,
    "steps_to_verdict_end": INT,
}
_VERDICT = {"name": STR, "why": STR, "levers": [STR], "try": (dict, None), "evidence": dict}
_PHASE = {"name": STR, "host_ms": NUM, "gpu_ms": NUM, "synced_ms": NUM, "share": NUM}
_KERNEL = {
    "name": STR,
    "category": STR,
    "phase": STR,
    "ms_per_step": NUM,
    "pct_gpu": NUM,
    "count_per_step": NUM,
    "mean_us": NUM,
    "tensor_core": BOOL,
}
_CATEGORY = {"name": STR, "ms_per_step": NUM, "pct_gpu": NUM, "count_per_step": NUM}
_CPU_OP = {"name": STR, "calls_per_step": NUM, "self_ms_per_step": NUM, "total_ms_per_step": NUM}
_ARTIFACTS = {"timeline": STR, "trace": STR, "summary": STR, "profile": STR}

PROFILE_SPEC = {
    "schema": STR,
    "created": STR,
    "meta": _META,
    "window": _WINDOW,
    "headline": _HEADLINE,
    "verdict": _VERDICT,
    "phases": [_PHASE],
    "categories": [_CATEGORY],
    "kernels": [_KERNEL],
    "cpu_ops": [_CPU_OP],
    "artifacts": _ARTIFACTS,
}
SUMMARY_SPEC = {
    "schema": STR,
    "meta": {k: _META[k] for k in ("model", "device", "device_name", "batch", "imgsz", "amp", "amp_dtype", "workers")},
    "window": _WINDOW,
    "real_step": {k: _HEADLINE[k] for k in ("step_ms", "data_ms", "img_s", "data_frac", "utilization")},
    "phases_ms": dict,
    "verdict": STR,
    "why": STR,
    "levers": [STR],
    "peak_vram_mb": {"allocated": OPT_NUM, "reserved": OPT_NUM, "total": OPT_NUM},
}


class ProfileFileError(LibreYOLOError, ValueError):
    """A profile file that is missing, not JSON, or not of the expected schema."""


def _is(value: Any, kind: Any) -> bool:
    if kind is None:
        return value is None
    if kind is dict:
        return isinstance(value, dict)
    if kind == NUM:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == STR:
        return isinstance(value, str)
    if kind == BOOL:
        return isinstance(value, bool)
    raise TypeError(kind)


def _describe(kind: Any) -> str:
    if isinstance(kind, tuple):
        return " or ".join(_describe(k) for k in kind)
    if isinstance(kind, list):
        return "a list"
    if isinstance(kind, dict) or kind is dict:
        return "an object"
    return "null" if kind is None else f"a {kind}"


def check(value: Any, spec: Any, where: str = "") -> list[str]:
    """Problems with `value` against `spec` (a kind, a tuple of kinds, [item spec] or {key: spec})."""
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return [f"{where or 'top level'}: expected an object, found {type(value).__name__}"]
        problems = [f"{where}{'.' if where else ''}{k}: missing" for k in spec if k not in value]
        for k, sub in spec.items():
            if k in value:
                problems += check(value[k], sub, f"{where}{'.' if where else ''}{k}")
        return problems
    if isinstance(spec, list):
        if not isinstance(value, list):
            return [f"{where}: expected a list, found {type(value).__name__}"]
        return [p for i, item in enumerate(value) for p in check(item, spec[0], f"{where}[{i}]")]
    kinds = spec if isinstance(spec, tuple) else (spec,)
    if any(_is(value, k) for k in kinds):
        return []
    return [f"{where}: expected {_describe(spec)}, found {value!r}"[:300]]


def validate(data: Any, schema: str, where: str = "profile") -> None:
    spec = {SCHEMA: PROFILE_SPEC, SUMMARY_SCHEMA: SUMMARY_SPEC}[schema]
    found = data.get("schema") if isinstance(data, dict) else None
    if found != schema:
        raise ProfileFileError(
            f"{where}: schema is {found!r}, expected {schema!r}. "
            "Is this a file written by `libreyolo profile run` (or train profile=true) of this version?"
        )
    problems = check(data, spec)
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ProfileFileError(f"{where}: not a valid {schema} file: " + "; ".join(problems[:5]) + more)


def load_profile(path: str | os.PathLike) -> dict[str, Any]:
    """A profile.json, or a run folder holding one, read and validated."""
    p = Path(path)
    if p.is_dir():
        p = p / "profile.json"
    if not p.is_file():
        raise ProfileFileError(
            f"{p} does not exist; pass a profile.json written by `libreyolo profile run` or train profile=true (or its "
            "run folder)"
        )
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ProfileFileError(f"{p} is not JSON ({e}); pass a profile.json") from None
    validate(data, SCHEMA, str(p))
    return data
