"""A run folder is where its files are: a copied or moved run resumes into its own folder, one writer per folder,
checkpoints a resume can recover from (docs/reliability.md)."""

import csv
import hashlib
import os
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import FAST

from libreyolo import LibreYOLO
from libreyolo.engine.checkpoint import load_checkpoint, load_resumable, previous_of, save_atomic
from libreyolo.errors import CheckpointError, ConfigError
from libreyolo.events import read_events
from libreyolo.runs import LOCK_NAME, lock_run_dir, unlock_run_dir


class _StopAfterFirstEpoch:
    def __call__(self, e):
        if e.type == "epoch_end" and e.epoch == 0:
            raise KeyboardInterrupt


@pytest.fixture(scope="module")
def unfinished(tmp_path_factory, tiny_data):
    """A run of 2 epochs stopped (Ctrl-C) after its first: runs/exp with last.pt at epoch 1."""
    project = tmp_path_factory.mktemp("unfinished")
    with pytest.raises(KeyboardInterrupt):
        LibreYOLO("LibreYOLO9t").train(
            **FAST,
            data=str(tiny_data),
            epochs=2,
            no_aug_epochs=1,
            project=str(project),
            callbacks=[_StopAfterFirstEpoch()],
        )
    run = project / "exp"
    assert load_checkpoint(run / "weights" / "last.pt")["epoch"] == 1
    return run


def _hashes(folder):
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _resume(run):
    LibreYOLO("LibreYOLO9t").train(resume=str(run / "weights" / "last.pt"))  # as `libreyolo train resume=...`
    return list(read_events(run / "events.jsonl"))


def _complete(run):
    rows = list(csv.DictReader(open(run / "results.csv")))
    assert [r["epoch"] for r in rows] == ["1", "2"]
    assert load_checkpoint(run / "weights" / "last.pt")["epoch"] == 2
    assert [e["status"] for e in read_events(run / "events.jsonl") if e["type"] == "run_end"][-1] == "finished"


def test_a_copied_run_resumes_into_the_copy_and_leaves_the_original_as_it_was(unfinished, tmp_path):
    copy = tmp_path / "elsewhere" / "exp"
    shutil.copytree(unfinished, copy)
    before = _hashes(unfinished)
    events = _resume(copy)
    assert _hashes(unfinished) == before  # not one byte of the original written
    _complete(copy)
    start = [e for e in events if e["type"] == "run_start"][-1]
    assert start["run_dir"] == str(copy) and start["resumed"]
    notes = [e["message"] for e in events if e["type"] == "warning" and "continues in" in e["message"]]
    assert len(notes) == 1 and str(unfinished) in notes[0] and str(copy) in notes[0]


def test_a_moved_run_with_a_broken_last_pt_and_best_pt_resumes_where_it_is_now(unfinished, tmp_path):
    """Moved (the old path is never re-created), its last.pt truncated (the previous one is used, with a line) and
    its best.pt garbage (a warning; it does not block the resume)."""
    old = tmp_path / "old" / "exp"
    shutil.copytree(unfinished, old)
    last = old / "weights" / "last.pt"
    for path in (last, previous_of(last)):  # their stored run_dir says old/exp, as if the run had started there
        ck = load_checkpoint(path)
        ck["train"]["run_dir"] = str(old)
        save_atomic(ck, path, keep_previous=False)
    assert load_checkpoint(previous_of(last))["epoch"] == 1  # the rotation kept the last.pt it replaced
    run = tmp_path / "new" / "exp"
    shutil.move(old.parent, run.parent)
    last, best = run / "weights" / "last.pt", run / "weights" / "best.pt"
    last.write_bytes(last.read_bytes()[:5000])
    best.write_bytes(b"PK\x03\x04 not a checkpoint any more")
    events = _resume(run)
    assert not old.exists()
    _complete(run)
    warnings = [e["message"] for e in events if e["type"] == "warning"]
    assert any(str(old) in w and f"continues in {run}" in w for w in warnings), warnings
    assert any(str(last) in w and str(previous_of(last)) in w and "resuming from" in w for w in warnings), warnings
    assert any(str(best) in w and "writes a new best.pt" in w for w in warnings), warnings
    assert load_checkpoint(best)["epoch"] == 2  # the next improvement wrote a readable best.pt


def test_save_keeps_the_previous_last_pt_and_load_says_what_to_do_when_nothing_is_readable(tmp_path):
    last = tmp_path / "weights" / "last.pt"
    for n in range(3):
        save_atomic({"n": torch.tensor(n)}, last)
    assert torch.load(last, weights_only=True)["n"] == 2
    assert torch.load(previous_of(last), weights_only=True)["n"] == 1
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.prev.pt", "last.pt"]  # no temporary left
    last.write_bytes(b"\x80\x04 garbage")
    previous_of(last).write_bytes(b"\x80\x04 garbage too")
    with pytest.raises(CheckpointError) as e:
        load_resumable(last)
    assert "cannot be resumed" in str(e.value) and "libreyolo train" in str(e.value)


def test_a_second_writer_is_refused_with_the_pid_of_the_first(tiny_data, tmp_path):
    run = tmp_path / "x"
    run.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from libreyolo.runs import lock_run_dir; lock_run_dir(sys.argv[1]); print('held', "
            "flush=True); time.sleep(120)",
            str(run),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError) as e:
            LibreYOLO("LibreYOLO9t").train(
                **FAST, data=str(tiny_data), epochs=1, project=str(tmp_path), name="x", exist_ok=True
            )
        assert f"pid {holder.pid}" in str(e.value) and str(run) in str(e.value)
        assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]  # nothing written by the refused run
    finally:
        holder.kill()  # as kill -9: the kernel releases the lock
        holder.wait()
    lock_run_dir(run)
    unlock_run_dir(run)


def test_the_lock_is_counted_within_one_process_and_released_by_its_last_holder(tmp_path):
    lock_run_dir(tmp_path)
    lock_run_dir(tmp_path)  # a second run of the same process (a failed one left its lock): not refused
    unlock_run_dir(tmp_path)
    probe = [sys.executable, "-c", "import sys; from libreyolo.runs import lock_run_dir; lock_run_dir(sys.argv[1])"]
    assert subprocess.run([*probe, str(tmp_path)], capture_output=True).returncode != 0
    unlock_run_dir(tmp_path)
    r = subprocess.run([*probe, str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert os.path.isfile(tmp_path / LOCK_NAME)
