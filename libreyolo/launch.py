"""The spawn launcher: `model.train(device="0,1")` outside torchrun starts one training process per GPU.

The parent saves the model's weights to a temporary file, resolves autobatch, and starts the workers with
torch.multiprocessing (spawn). Each worker sets the variables torchrun would set (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), rebuilds the model from the saved weights and calls `LibreYOLO.fit`, a
process's part of a run, which finds itself in a distributed environment (distributed/context.py). When the
run ends, rank 0's best checkpoint is loaded into the caller's model; the temporary folder goes whatever happens.

GPU and CPU runs share all of this except device selection: LIBREYOLO_CPU_WORLD_SIZE=N with device=cpu starts
N Gloo CPU processes instead (how the tests exercise the launcher on machines without GPUs)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from libreyolo import errors
from libreyolo.atomic import write_text
from libreyolo.config import TrainConfig
from libreyolo.distributed.context import DistContext, family_message, split_batch
from libreyolo.distributed.device import parse_device, torchrun_env
from libreyolo.errors import ConfigError, LibreYOLOError

SPAWNED_ENV = "LIBREYOLO_DDP_SPAWNED"  # set in every worker: a second launch from inside one is the missing-guard bug
CPU_WORLD_ENV = "LIBREYOLO_CPU_WORLD_SIZE"
FAILURE_GRACE_S = 5.0  # after one worker fails, the others get this long to exit before SIGTERM, then SIGKILL
INTERRUPT_GRACE_S = 60.0  # after Ctrl-C, rank 0 gets this long to write last.pt
STRAGGLER_S = 30.0  # rank 0 has exited cleanly: the others follow within moments, or are stopped after this

GUARD_MESSAGE = (
    "spawn_ddp_train() was called from inside a spawned subprocess. This usually\n"
    "means your script calls model.train(device=...) at the top level without a\n"
    "'if __name__ == \"__main__\":' guard."
)


class DistributedError(LibreYOLOError, RuntimeError):
    """A training process failed, or the launcher cannot start them."""


@dataclass
class _Job:
    """Everything a worker needs; pickled once per worker by multiprocessing."""

    nprocs: int
    gpus: list[int]
    port: int
    folder: str
    weights: str
    source: str
    trained: bool
    model_class: type  # the caller's LibreYOLO class (pickled by name): this module never imports the facade
    kwargs: dict[str, Any] = field(default_factory=dict)


def spawn_plan(cfg: TrainConfig) -> tuple[list[int], int] | None:
    """None: train in this process (one device, or already under torchrun). Else (GPU indices, processes);
    no GPU indices means CPU processes on Gloo."""
    if torchrun_env() is not None:
        return None
    spec = cfg.device
    if cfg.resume and "device" not in cfg.user_keys:
        spec = _resumed_device(cfg) or spec
    kind, gpus = parse_device(spec)
    if kind == "cuda" and len(gpus) > 1:
        return gpus, len(gpus)
    cpu_world = os.environ.get(CPU_WORLD_ENV, "").strip()
    if kind == "cpu" and cpu_world:
        if not cpu_world.isdigit() or int(cpu_world) < 1:
            raise ConfigError(f"{CPU_WORLD_ENV}={cpu_world!r}: expected a number of CPU training processes (1 or more)")
        if int(cpu_world) > 1:
            return [], int(cpu_world)
    return None


def spawn_ddp_train(model: Any, kwargs: dict[str, Any], gpus: list[int], nprocs: int) -> dict[str, float]:
    """Train `model` with one process per GPU (or `nprocs` CPU processes when `gpus` is empty); afterwards the
    model holds rank 0's best weights. Returns the best epoch's metrics."""
    if os.environ.get(SPAWNED_ENV):
        raise DistributedError(GUARD_MESSAGE)
    family = model.family
    cfg = TrainConfig.from_overrides(kwargs, family=family)
    if not family.supports_ddp:
        raise ConfigError(family_message(family.name, cfg.device, nprocs))
    check_picklable(kwargs, cfg.device)
    kwargs = dict(kwargs)
    if not cfg.resume:
        kwargs["batch"] = _parent_batch(model, cfg, gpus, nprocs)

    folder = Path(tempfile.mkdtemp(prefix="libreyolo-ddp-"))
    ctx = None
    try:
        weights = model.save(folder / "weights.pt")
        job = _Job(
            nprocs, list(gpus), free_port(), str(folder), str(weights), model.source, model.trained, type(model), kwargs
        )
        with _child_env(gpus):
            ctx = mp.start_processes(_worker, args=(job,), nprocs=nprocs, join=False, start_method="spawn")
        result_file = folder / "result.json"
        try:
            _join(ctx, folder)
        except DistributedError as e:
            if not result_file.exists():
                raise
            # rank 0 had finished and reported; a crash after that (teardown) does not undo a complete run
            warnings.warn(
                f"the run finished, but a training process failed while exiting: {e}", RuntimeWarning, stacklevel=2
            )
        if not result_file.exists():  # every worker exited cleanly without finishing: they were interrupted
            raise KeyboardInterrupt
        result = json.loads(result_file.read_text())
        model.adopt_run(Path(result["run_dir"]), result["metrics"])
        return result["metrics"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        for f in ctx.error_files if ctx is not None else []:
            Path(f).unlink(missing_ok=True)


def check_picklable(kwargs: dict[str, Any], device: str) -> None:
    """Every train() argument crosses into the workers by pickle; say which one cannot, and why, before starting."""
    for key, value in kwargs.items():
        items = list(enumerate(value)) if key == "callbacks" else [(None, value)]
        for i, v in items:
            try:
                ForkingPickler.dumps(v)
            except Exception as e:  # PicklingError, AttributeError ("Can't pickle local object"), TypeError
                name = key if i is None else f"{key}[{i}]"
                raise ConfigError(
                    f"{name}={v!r} cannot be sent to the training processes ({type(e).__name__}: {e}). device={device} "
                    f"trains in one process per device and pickles every train() argument, which a lambda, a closure "
                    f"or a class defined inside a function cannot be. Use a module-level class (with __call__) or "
                    f"function; note it runs in rank 0's process. Or rely on the built-in loggers, which rank 0 runs "
                    f"in every run: run_dir/events.jsonl (read it with libreyolo.events.read_events), "
                    f"run_dir/results.csv and the terminal renderer."
                ) from None


def free_port() -> int:
    """A TCP port nobody listens on now, for rank 0's rendezvous store."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- parent side -------------------------------------------------------------------------------------
def _resumed_device(cfg: TrainConfig) -> str | None:
    """A resumed run trains on the devices it started on, unless device= is given again."""
    from libreyolo.engine.checkpoint import load_checkpoint, resolve_resume_path

    try:
        return str(load_checkpoint(resolve_resume_path(cfg)).get("train_args", {}).get("device") or "") or None
    except LibreYOLOError:
        return None  # setup reports the bad path with its own message


def _parent_batch(model: Any, cfg: TrainConfig, gpus: list[int], nprocs: int) -> int:
    """The global batch, settled before any worker exists: autobatch probes here (one GPU, a throwaway copy of
    the network), and a batch the world size does not divide fails now rather than in every worker."""
    from libreyolo.amp import resolve_amp
    from libreyolo.data.config import load_data_config
    from libreyolo.engine import autobatch

    data = load_data_config(cfg.data)  # also generates the built-in dataset once, not once per worker
    cfg.fill_unset(data.suggested)  # as setup will: the dataset's suggestions (batch, imgsz)
    device = torch.device(f"cuda:{gpus[0]}" if gpus else "cpu")
    notes: list[str] = []
    with torch.cuda.device(device) if gpus else contextlib.nullcontext():
        probe = lambda: autobatch.probe_model(model.family, model.size, data.nc, cfg, device)  # noqa: E731
        dtype = resolve_amp(cfg.amp, cfg.amp_dtype, device).autocast_dtype
        # this process is not a rank: a world of nprocs with no process group, so it probes and keeps the result
        batch = autobatch.resolve_global_batch(cfg, device, DistContext(world_size=nprocs), probe, dtype, notes)
        if gpus:
            torch.cuda.empty_cache()  # the probe's network is gone; its memory goes back before the workers start
    for line in notes:
        print(line, flush=True)
    split_batch(batch, nprocs)
    return batch


class _child_env:
    """Variables the workers inherit at start: the guard marker, and which GPUs they see (so that LOCAL_RANK
    indexes the GPUs `device` named, as under torchrun)."""

    def __init__(self, gpus: list[int]):
        self.set = {SPAWNED_ENV: "1"}
        if gpus:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
            ids = (
                [x.strip() for x in visible.split(",") if x.strip()]
                if visible.strip()
                else [str(i) for i in range(max(gpus) + 1)]
            )
            self.set["CUDA_VISIBLE_DEVICES"] = ",".join(ids[g] for g in gpus)
        self.old: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for k, v in self.set.items():
            self.old[k] = os.environ.get(k)
            os.environ[k] = v

    def __exit__(self, *exc: Any) -> None:
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _join(ctx: Any, folder: Path) -> None:
    """Wait for the workers. torch's ProcessContext.join ends the others when one fails (grace, SIGTERM,
    SIGKILL) and raises with the first failure; Ctrl-C here stops them all, leaving rank 0 time to save."""
    procs, rank0_done = ctx.processes, None
    try:
        while not ctx.join(timeout=1.0, grace_period=FAILURE_GRACE_S):
            # rank 0 ended cleanly (finished, or interrupted on its own): a rank > 0 still blocked in a collective
            # that rank 0 will never join must not outlive it
            if procs[0].exitcode == 0:
                rank0_done = rank0_done or time.monotonic()
                if time.monotonic() - rank0_done > STRAGGLER_S:
                    _stop(procs)
                    return
    except KeyboardInterrupt:
        _stop(ctx.processes)
        raise
    except mp.ProcessRaisedException as e:
        raise _failure(e, folder, ctx) from None
    except mp.ProcessExitedException as e:
        raise _failure(e, folder, ctx) from None


def _failure(e: Exception, folder: Path, ctx: Any) -> Exception:
    """The first failed rank's error, plus how every rank ended: when one rank is killed, its peers fail a moment
    later with communication errors, and the statuses show which came first."""
    rank, n = e.error_index, len(ctx.processes)
    ended = ", ".join(f"rank {i}: {_status(p.exitcode)}" for i, p in enumerate(ctx.processes))
    others = f"the other {n - 1} training process(es) were stopped ({ended})"
    report = folder / f"error-rank{rank}.json"
    if report.exists():  # a LibreYOLOError: re-raise it as itself, so the CLI prints it without a traceback
        info = json.loads(report.read_text())
        cls = getattr(errors, info["type"], None)
        cls = cls if isinstance(cls, type) and issubclass(cls, LibreYOLOError) else DistributedError
        return cls(f"rank {rank}: {info['message']}")
    if isinstance(e, mp.ProcessRaisedException):
        return DistributedError(f"training process rank {rank} (pid {e.error_pid}) failed; {others}.{e.msg}")
    if e.signal_name:
        hint = " (SIGKILL often comes from the kernel's out-of-memory killer)" if e.signal_name == "SIGKILL" else ""
        return DistributedError(
            f"training process rank {rank} (pid {e.error_pid}) was killed by {e.signal_name}{hint}; {others}."
        )
    return DistributedError(
        f"training process rank {rank} (pid {e.error_pid}) exited with code {e.exit_code} without reporting an error "
        f"(its output is above); {others}. If it never started training, the usual cause is a script that calls "
        f"model.train(device=...) at the top level without an 'if __name__ == \"__main__\":' guard."
    )


def _status(code: int | None) -> str:
    if code is None:
        return "running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _stop(procs: list[Any]) -> None:
    """Ctrl-C: rank 0 gets SIGINT (once: a terminal may already have sent it to the whole group) and time to
    write last.pt; the others ignore SIGINT and end when rank 0 leaves their next collective, or are killed."""
    restore = None
    if threading.current_thread() is threading.main_thread():
        restore = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave orphans behind
    try:
        if procs[0].is_alive():
            os.kill(procs[0].pid, signal.SIGINT)
        procs[0].join(INTERRUPT_GRACE_S)
        _wait(procs, FAILURE_GRACE_S)
        for p in procs:
            if p.is_alive():
                p.terminate()
        _wait(procs, FAILURE_GRACE_S)
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
    finally:
        if restore is not None:
            signal.signal(signal.SIGINT, restore)


def _wait(procs: list[Any], seconds: float) -> None:
    end = time.monotonic() + seconds
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))


# --- worker side -------------------------------------------------------------------------------------
def _worker(index: int, job: _Job) -> None:
    os.environ.update(
        {
            "RANK": str(index),
            "LOCAL_RANK": str(index),
            "WORLD_SIZE": str(job.nprocs),
            "LOCAL_WORLD_SIZE": str(job.nprocs),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(job.port),
        }
    )
    parent = os.getppid()
    _signal_policy(index, parent, job.folder)
    if not job.gpus:  # N CPU processes share the cores instead of each starting one thread per core
        from libreyolo.data.cpus import cpu_count

        torch.set_num_threads(max(1, cpu_count() // job.nprocs))
    folder = Path(job.folder)
    try:
        model = job.model_class(job.weights)
        # an untrained model is rebuilt under the run's seed by the ordinary path, exactly as on one device
        model.source, model.trained = job.source, job.trained
        metrics = model.fit(job.kwargs)  # this rank's part: train() already planned the launch in the parent
    except LibreYOLOError as e:
        (folder / f"error-rank{index}.json").write_text(json.dumps({"type": type(e).__name__, "message": str(e)}))
        raise
    finally:
        if index == 0 and os.getppid() != parent:  # the parent was killed and cannot remove its temporary folder
            shutil.rmtree(folder, ignore_errors=True)
    if index == 0:
        write_text(folder / "result.json", json.dumps({"run_dir": str(model.last_run), "metrics": metrics}))


def _signal_policy(rank: int, parent: int, folder: str) -> None:
    """Only rank 0 stops on SIGINT/SIGTERM: it becomes one KeyboardInterrupt, on which the trainer saves last.pt
    (later signals are ignored, so a signal sent both to the group and by the parent cannot cut the save).

    Ranks > 0 ignore both. Were they to stop too, rank 0 could be blocked in a collective that a stopped rank
    never joins, and would get a communication error instead of the interrupt, losing the save. They end
    when rank 0's departure breaks their next collective, or by SIGKILL from the parent (also if it dies)."""
    if rank > 0:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _die_with_parent()
        return
    _exit_after_parent(parent, folder)

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _exit_after_parent(parent: int, folder: str) -> None:
    """Rank 0 gets SIGINT when the parent dies (torch's spawn asks Linux for it) and saves last.pt; but if it is
    blocked in a collective that the killed ranks will never join (NCCL waits, it does not fail), no signal
    handler can run. This thread ends the process once the parent is gone and the save had its time."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        time.sleep(INTERRUPT_GRACE_S)
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=watch, name="libreyolo-parent-watch", daemon=True).start()


def _die_with_parent() -> None:
    """torch's spawn asks Linux for SIGINT when the parent dies; a rank that ignores SIGINT needs SIGKILL instead."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
