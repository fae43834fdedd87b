"""Whether every start of this Python compiles torch from source.

`import torch` loads ~1,000 Python modules. pip writes their bytecode cache at install time, but a Docker image
that sets PYTHONDONTWRITEBYTECODE=1 (a common Dockerfile line) and installed torch without it leaves none, and
Python then compiles every module again in every process: `import torch` took 3.8-5.2 s on the H200 machine
instead of 1.7 s with the cache (docs/performance.md). Compiling once with compileall removes that; the setup
says so in one line."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType


def uncached_bytecode_note(module: ModuleType) -> str | None:
    """A note if `module` (imported in this process) was compiled from source because no bytecode cache exists for
    it; None if its cache exists (Python read it, or wrote it during this import) or it has no source file."""
    src = getattr(module, "__file__", None)
    if not src or not src.endswith(".py"):
        return None
    try:
        cached = importlib.util.cache_from_source(src)
    except NotImplementedError:  # an interpreter without a bytecode cache
        return None
    if os.path.exists(cached):
        return None
    why = " (PYTHONDONTWRITEBYTECODE is set)" if sys.flags.dont_write_bytecode else ""
    folder = os.path.dirname(src)
    return (
        f"{module.__name__} has no bytecode cache{why}, so every start compiles its modules from source; "
        f"compile them once: {os.path.basename(sys.executable)} -m compileall -q {folder}"
    )
