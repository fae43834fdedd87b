"""Elastic restarts: under `torchrun --max-restarts=N` a failed worker makes torchrun's agent restart the whole group
with the same command, and the restarted workers must continue the run, not start a new one in exp2.

torchrun gives every worker the job's rendezvous id (TORCHELASTIC_RUN_ID: `--rdzv-id`, or a fresh uuid per
`--standalone` launch) and the attempt (TORCHELASTIC_RESTART_COUNT, 0 first). Rank 0 of an attempt writes the id into
its run folder; a restarted attempt (count > 0) whose keys ask for no resume looks for that folder under `project`
and resumes its last.pt there. Every rank finds the same folder: the project folder must be one filesystem for all
of them (one node, or a shared folder across nodes, as resume= needs anyway). A new torchrun launch with the same
explicit `--rdzv-id` as an old job is a new job: its attempt 0 never looks."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from libreyolo.atomic import write_text

RUN_ID_ENV, RESTART_ENV = "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"
MARKER = ".elastic-run-id"


def job_id() -> str | None:
    """The rendezvous id of the torchrun job this process is a worker of, None outside torchrun."""
    return os.environ.get(RUN_ID_ENV) if RESTART_ENV in os.environ else None


def restart_count() -> int:
    return int(os.environ.get(RESTART_ENV, "0") or 0)


def mark(run_dir: Path) -> None:
    """Rank 0: record the torchrun job in its run folder (atomically), so that a restart of the job finds it."""
    rid = job_id()
    if rid is None:
        return
    write_text(run_dir / MARKER, rid + "\n")


def restarted_run(project: str | os.PathLike[str]) -> Path | None:
    """In a restarted attempt of a torchrun job: the run folder its first attempt made (the newest, where an earlier
    job reused the id), None otherwise."""
    rid = job_id()
    if rid is None or restart_count() == 0:
        return None
    found = []
    for marker in Path(project).glob(f"*/{MARKER}"):
        try:
            if marker.read_text().strip() == rid:
                found.append((marker.stat().st_mtime, marker.parent))
        except OSError:
            continue
    return max(found)[1] if found else None


def attempt_store(timeout: timedelta) -> dist.Store | None:
    """Under torchrun: the job's store (torch's env:// rendezvous) seen through a prefix of this attempt, None
    outside torchrun. The store outlives an attempt, and an attempt that keys its process group as the last one did
    reads the dead workers' addresses: a restarted Gloo group then failed to connect ("connectFullMesh ... Connection
    refused"), seen in one of two restarts on this project's CPU machine. Every worker of one node has the same
    attempt number; across nodes torch counts a restart only where a worker failed (docs/multi-gpu.md)."""
    if job_id() is None:
        return None
    store, _, _ = next(dist.rendezvous("env://", timeout=timeout))
    return dist.PrefixStore(f"libreyolo/attempt-{restart_count()}", store)
