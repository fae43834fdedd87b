"""Multi-process training on CPU with 2 Gloo processes: the spawn launcher end to end, torchrun, the
__main__ guard, a killed worker, Ctrl-C, and no process left behind.

LIBREYOLO_CPU_WORLD_SIZE=2 makes device=cpu go through the same launcher as device=0,1 (only device
selection differs). Every process a test starts carries a unique environment tag, so leftovers are found
by tag (psutil) rather than by guessing names."""

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.engine.checkpoint import load_checkpoint
from libreyolo.events import read_events, validate_event
from libreyolo.launch import CPU_WORLD_ENV, GUARD_MESSAGE, SPAWNED_ENV

TAG = "LIBREYOLO_TEST_TAG"
TINY = dict(epochs=1, imgsz=64, batch=4, workers=0, device="cpu")


class PidLog:
    """A module-level callback, so it pickles: appends 'pid type' per event to a file."""

    def __init__(self, path):
        self.path = str(path)

    def __call__(self, e):
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()} {e.type}\n")


def _env(tag: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", SPAWNED_ENV)}
    env.update({CPU_WORLD_ENV: "2", TAG: tag, "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    return env


def _tagged(tag: str, exclude: tuple[int, ...] = ()) -> list[psutil.Process]:
    """Live processes carrying the tag, except multiprocessing's resource tracker (it belongs to its parent's
    lifetime)."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.pid in exclude or p.environ().get(TAG) != tag or p.status() == psutil.STATUS_ZOMBIE:
                continue
            if "resource_tracker" in " ".join(p.cmdline()):
                continue
            out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def _assert_none_left(tag: str, exclude: tuple[int, ...] = (), within: float = 10.0) -> None:
    deadline = time.time() + within
    while (left := _tagged(tag, exclude)) and time.time() < deadline:
        time.sleep(0.2)
    assert not left, [(p.pid, p.cmdline()) for p in left]


def _temp_folders() -> set[str]:
    """The launcher's temporary folders (weights for the workers, their reports) that exist now."""
    return {p.name for p in Path(tempfile.gettempdir()).glob("libreyolo-ddp-*")}


def _wait_event(events: Path, pred, proc: subprocess.Popen, timeout: float = 180.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if events.exists():
            for e in read_events(events):
                if pred(e):
                    return e
        if proc.poll() is not None:
            pytest.fail(
                f"the run ended (rc {proc.returncode}) before the awaited event: "
                f"{proc.stderr.read() if proc.stderr else ''}"
            )
        time.sleep(0.05)
    pytest.fail("timed out waiting for an event")


def _cli(data, project, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "libreyolo.cli.main",
        "train",
        f"data={data}",
        "imgsz=64",
        "batch=4",
        "workers=0",
        "device=cpu",
        f"project={project}",
        "log_interval=0.05",
        *extra,
    ]


@contextlib.contextmanager
def _cli_run(data, project, tag: str, *extra: str):
    """`libreyolo train` with 2 CPU ranks in its own session; whatever happens, nothing of it survives the test."""
    p = subprocess.Popen(
        _cli(data, project, *extra),
        env=_env(tag),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        yield p
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_spawn_launch_end_to_end(tiny_data, tmp_path, monkeypatch):
    tag = uuid.uuid4().hex
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", SPAWNED_ENV):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv(CPU_WORLD_ENV, "2")
    monkeypatch.setenv(TAG, tag)
    log = tmp_path / "callback.log"
    temp_before = _temp_folders()
    m = LibreYOLO("LibreYOLO9t")
    metrics = m.train(data=str(tiny_data), project=str(tmp_path / "runs"), callbacks=[PidLog(log)], **TINY)

    # one run folder, chosen by rank 0 and used by both ranks; only rank 0 wrote into it
    run = tmp_path / "runs" / "exp"
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["exp"] and m.last_run == run
    written = sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.suffix not in (".png", ".jpg"))  # no plots
    assert written == [
        ".libreyolo.lock",  # rank 0's writer lock (runs.lock_run_dir)
        "args.yaml",
        "events.jsonl",
        "results.csv",
        "weights",
        "weights/best.pt",
        "weights/last.prev.pt",
        "weights/last.pt",
    ]
    events = list(read_events(run / "events.jsonl"))
    for e in events:
        validate_event(e)
    starts = [e for e in events if e["type"] == "run_start"]
    assert len(starts) == 1 and len([e for e in events if e["type"] == "run_end"]) == 1
    rs = starts[0]
    assert (rs["world_size"], rs["batch"], rs["batch_per_rank"], rs["steps_per_epoch"]) == (2, 4, 2, 4)
    assert rs["pid"] != os.getpid() and events[-1]["status"] == "finished"
    assert len((run / "results.csv").read_text().splitlines()) == 2
    # the callback ran once per event, in rank 0's process only
    lines = [line.split() for line in log.read_text().splitlines()]
    assert {pid for pid, _ in lines} == {str(rs["pid"])} and [t for _, t in lines] == [e["type"] for e in events]
    # the caller's model now holds rank 0's best weights
    best = load_checkpoint(run / "weights" / "best.pt")["model"]
    assert m.trained and all(torch.equal(v, best[k]) for k, v in m.net.state_dict().items())
    assert set(metrics) >= {"map50", "map"} and m.metrics == metrics
    assert _temp_folders() <= temp_before  # the weights handed to the workers are gone
    _assert_none_left(tag, exclude=(os.getpid(),))


def test_torchrun_launch_starts_no_processes_of_its_own(tiny_data, tmp_path):
    tag = uuid.uuid4().hex
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(f"""
        import os
        from libreyolo import LibreYOLO

        if __name__ == "__main__":
            m = LibreYOLO("LibreYOLO9t")
            m.train(data={str(tiny_data)!r}, project={str(tmp_path / "runs")!r}, **{TINY!r})
            # a file per rank: both ranks share torchrun's stdout, where their prints can interleave
            with open(os.path.join({str(tmp_path)!r}, "result_" + os.environ["RANK"]), "w") as f:
                f.write(f"{{os.getpid()}} {{m.last_run}} {{m.trained}}")
    """)
    )
    # LIBREYOLO_CPU_WORLD_SIZE=2 is set too: under torchrun it must not start 2 more processes per rank
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    r = subprocess.run(cmd, env=_env(tag), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = {int(f.name.split("_")[1]): f.read_text().split() for f in tmp_path.glob("result_*")}
    assert sorted(results) == [0, 1]
    run = tmp_path / "runs" / "exp"
    assert results[0][1] == results[1][1] == str(run) and results[0][2] == "True"  # every rank agrees on the run dir
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["exp"]
    events = list(read_events(run / "events.jsonl"))
    rs = [e for e in events if e["type"] == "run_start"]
    assert (
        len(rs) == 1
        and rs[0]["world_size"] == 2
        and rs[0]["batch_per_rank"] == 2
        and str(rs[0]["pid"]) == results[0][0]
    )
    _assert_none_left(tag)


def test_unguarded_script_gets_the_guard_error(tiny_data, tmp_path):
    tag = uuid.uuid4().hex
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(f"""
        from libreyolo import LibreYOLO

        LibreYOLO("LibreYOLO9t").train(data={str(tiny_data)!r}, project={str(tmp_path / "runs")!r}, **{TINY!r})
    """)
    )
    r = subprocess.run([sys.executable, str(script)], env=_env(tag), capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert GUARD_MESSAGE in r.stderr, r.stderr[-3000:]  # printed by the workers that re-ran the script
    assert "without an 'if __name__ == \"__main__\":' guard" in r.stderr.splitlines()[-1]  # and the parent's own error
    assert not (tmp_path / "runs").exists()
    _assert_none_left(tag)


def test_killed_worker_ends_the_run_and_the_parent_raises(tiny_data, tmp_path):
    tag = uuid.uuid4().hex
    temp_before = _temp_folders()
    events = tmp_path / "exp" / "events.jsonl"
    with _cli_run(tiny_data, tmp_path, tag, "epochs=50") as p:
        rank0 = _wait_event(events, lambda e: e["type"] == "run_start", p)["pid"]
        _wait_event(events, lambda e: e["type"] == "step", p)
        # the launcher's spawned ranks (rank 0's forked children, such as the plot writer's, carry its command line)
        workers = [q for q in _tagged(tag) if "spawn_main" in " ".join(q.cmdline()) and q.ppid() == p.pid]
        assert len(workers) == 2 and rank0 in [q.pid for q in workers], workers
        rank1 = next(q for q in workers if q.pid != rank0)
        t0 = time.time()
        rank1.send_signal(signal.SIGKILL)
        _, err = p.communicate(timeout=120)
        took = time.time() - t0
    assert p.returncode == 2, err[-3000:]  # a LibreYOLOError from the CLI
    assert "rank 1" in err and "killed by SIGKILL" in err, err[-3000:]
    assert took < 30, f"the parent took {took:.0f}s to notice and end the run"
    assert _temp_folders() <= temp_before  # removed after a failure too
    _assert_none_left(tag)


def test_ctrl_c_stops_all_workers_and_leaves_a_resumable_last_pt(tiny_data, tmp_path):
    tag = uuid.uuid4().hex
    events = tmp_path / "exp" / "events.jsonl"
    with _cli_run(tiny_data, tmp_path, tag, "epochs=3", "val=false") as p:
        _wait_event(events, lambda e: e["type"] == "step" and e["epoch"] >= 1, p)
        p.send_signal(signal.SIGINT)  # to the parent only, as `kill -INT`; a terminal would signal the whole group
        _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-3000:]
    _assert_none_left(tag)
    last = tmp_path / "exp" / "weights" / "last.pt"
    ck = load_checkpoint(last)
    assert "train" in ck and ck["epoch"] >= 1
    assert [e["status"] for e in read_events(events) if e["type"] == "run_end"] == ["interrupted"]
    # resume: the checkpoint says device=cpu, the environment asks for 2 CPU processes again
    r = subprocess.run(
        [sys.executable, "-m", "libreyolo.cli.main", "train", f"resume={last}"],
        env=_env(tag),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert load_checkpoint(last)["epoch"] == 3
    evs = list(read_events(events))
    assert [e["status"] for e in evs if e["type"] == "run_end"] == ["interrupted", "finished"]
    assert [(e["resumed"], e["world_size"]) for e in evs if e["type"] == "run_start"] == [(False, 2), (True, 2)]
    _assert_none_left(tag)


def test_parent_killed_leaves_no_orphans(tiny_data, tmp_path):
    """kill -9 of the parent: rank 0 is told by the kernel (SIGINT), saves and exits; the other ranks are killed."""
    tag = uuid.uuid4().hex
    temp_before = _temp_folders()
    events = tmp_path / "exp" / "events.jsonl"
    with _cli_run(tiny_data, tmp_path, tag, "epochs=50") as p:
        _wait_event(events, lambda e: e["type"] == "step", p)
        p.kill()
        p.wait(timeout=30)
    _assert_none_left(tag, within=30.0)
    assert "train" in load_checkpoint(tmp_path / "exp" / "weights" / "last.pt")
    assert _temp_folders() <= temp_before  # rank 0 removed what the killed parent could not
