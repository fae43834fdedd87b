"""Elastic restarts: under `torchrun --max-restarts=N` a failed worker makes torchrun's agents restart the whole group
with the same command, and the restarted workers must continue the run, not start a new one in exp2.

torchrun gives every worker the job's rendezvous id (TORCHELASTIC_RUN_ID: `--rdzv-id`, or a fresh uuid per
`--standalone` launch). Rank 0 of an attempt writes the id into its run folder; a restarted attempt whose keys ask for
no resume looks for that folder under `project` and resumes its last.pt there. Every rank finds the same folder: the
project folder must be one filesystem for all of them (one node, or a shared folder across nodes, as resume= needs
anyway). A new torchrun launch with the same explicit `--rdzv-id` as an old job is a new job: its first attempt never
looks.

Which attempt this is cannot be read off TORCHELASTIC_RESTART_COUNT: each agent counts only the restarts its own
workers' failures caused. With two nodes, the node whose worker was killed restarts as attempt 1 while the other
node's agent restarts its healthy workers for the membership change and still says 0 (seen with torch 2.14.1; torch
issues #108158, #135712). The workers of an attempt therefore agree on it through torchrun's store before anything
else (`current`): rank 0 names the attempt, the others join it, and that answer decides both the run-folder lookup
and the store keys of the attempt's process group."""

from __future__ import annotations

import itertools
import os
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from libreyolo.atomic import write_text

RUN_ID_ENV, RESTART_ENV = "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"
MARKER = ".elastic-run-id"
# how long a worker waits at its start for the other workers of its attempt: torch's own default for a store
START_TIMEOUT = timedelta(minutes=30)
KEY = "libreyolo/elastic"
POLL_S = 0.05


@dataclass(frozen=True)
class Attempt:
    number: int  # the job's attempts before this one, agreed by every worker: 0 on the first
    key: str  # a store prefix no earlier attempt of the job wrote under
    store: dist.Store  # torchrun's store, opened once per process (without the agent's store, rank 0 hosts it)


_attempt: Attempt | None = None
_groups = itertools.count()  # process groups this process has keyed: a second train() must not read the first's


def job_id() -> str | None:
    """The rendezvous id of the torchrun job this process is a worker of, None outside torchrun."""
    return os.environ.get(RUN_ID_ENV) if RESTART_ENV in os.environ else None


def _local_restarts() -> int:
    return int(os.environ.get(RESTART_ENV, "0") or 0)


def restart_count() -> int:
    """The job's restarts before this attempt, as all its workers agree on it (0 outside torchrun)."""
    attempt = current()
    return attempt.number if attempt is not None else 0


def mark(run_dir: Path) -> None:
    """Rank 0: record the torchrun job in its run folder (atomically), so that a restart of the job finds it."""
    rid = job_id()
    if rid is None:
        return
    write_text(run_dir / MARKER, rid + "\n")


def restarted_run(project: str | os.PathLike[str]) -> Path | None:
    """In a restarted attempt of a torchrun job: the run folder its first attempt made (the newest, where an earlier
    job reused the id), None otherwise."""
    attempt = current()
    if attempt is None or attempt.number == 0:
        return None
    rid = job_id()
    found = []
    for marker in Path(project).glob(f"*/{MARKER}"):
        try:
            if marker.read_text().strip() == rid:
                found.append((marker.stat().st_mtime, marker.parent))
        except OSError:
            continue
    return max(found)[1] if found else None


def attempt_store(timeout: timedelta) -> dist.Store | None:
    """Under torchrun: the job's store seen through a prefix that no earlier attempt used, None outside torchrun.
    torchrun's agent hosts the store its workers get (TORCHELASTIC_USE_AGENT_STORE) and keeps it across attempts, so
    an attempt that keys its process group as the last one did reads the dead workers' addresses: the restarted Gloo
    group then fails to connect ("connectFullMesh ... Connection refused"), seen on one node and on two."""
    attempt = current()
    if attempt is None:
        return None
    attempt.store.set_timeout(timeout)
    return dist.PrefixStore(f"{attempt.key}/group{next(_groups)}", attempt.store)


def current() -> Attempt | None:
    """This torchrun attempt as every worker of it sees it (None outside torchrun); the first call agrees on it with
    the other workers, so every rank must make it (the trainer does, before its process group exists)."""
    global _attempt
    if job_id() is None:
        return None
    if _attempt is None:
        if dist.is_initialized():  # the script made the process group: its store is torchrun's, already open here
            store = dist.distributed_c10d._get_default_store()
            rank, world = dist.get_rank(), dist.get_world_size()
        else:
            store, rank, world = next(dist.rendezvous("env://", timeout=START_TIMEOUT))
        _attempt = _agree(store, rank, world)
    return _attempt


def _agree(store: dist.Store, rank: int, world: int) -> Attempt:
    """Rank 0 names the attempt by a fresh token under LEADER and counts it; the others join it. The store may hold
    the LEADER of an earlier attempt, whose rank 0 is dead (an attempt starts only after every agent stopped its
    workers): a worker reads it, joins it, and is never answered, so it looks again until a live rank 0 answers.
    Each worker is answered under a nonce of its own, which no earlier attempt can have written.

    The number: how many attempts reached this point before, counted in the agent's store, which lasts as long as the
    job (the `--standalone` and c10d default); with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 the store is new each attempt,
    and the largest TORCHELASTIC_RESTART_COUNT among the workers stands in for it (at least 1 after a failure)."""
    leader = f"{KEY}/leader"
    if rank == 0:
        earlier = store.add(f"{KEY}/attempts", 1) - 1
        token = uuid.uuid4().hex
        root = f"{KEY}/{token}"
        store.set(leader, token)
        keys = [f"{root}/rank{r}" for r in range(1, world)]
        if keys:
            store.wait(keys)
        joined = [store.get(k).decode().split() for k in keys]
        number = max([earlier, _local_restarts(), *(int(restarts) for _, restarts in joined)])
        for nonce, _ in joined:
            store.set(f"{root}/answer/{nonce}", str(number))
        return Attempt(number, root, store)
    nonce, token = uuid.uuid4().hex, ""
    deadline = time.monotonic() + START_TIMEOUT.total_seconds()
    while True:
        latest = store.get(leader).decode()  # blocks until a rank 0 has named one
        if latest != token:
            token = latest
            store.set(f"{KEY}/{token}/rank{rank}", f"{nonce} {_local_restarts()}")
        answer = f"{KEY}/{token}/answer/{nonce}"
        if store.check([answer]):
            return Attempt(int(store.get(answer).decode()), f"{KEY}/{token}", store)
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: rank 0 of this torchrun attempt did not answer in {START_TIMEOUT}")
        time.sleep(POLL_S)
