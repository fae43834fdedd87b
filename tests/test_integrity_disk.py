"""A full disk is one clear line and leaves every file whole; a broken torch/torchvision pair stops a run before its
first step; the pickle refusal gives no advice the library rejects (docs/reliability.md). The full disk is injected
(the write raises ENOSPC), never made."""

import errno
import json
import os

import pytest
import torch

from libreyolo.cli.main import main
from libreyolo.engine import checkpoint
from libreyolo.engine.checkpoint import load_checkpoint
from libreyolo.errors import CheckpointError, InstallError
from libreyolo.events import EventWriter
from libreyolo.nn import nms


def _train(tiny_data, project, capsys):
    argv = ["train", f"data={tiny_data}", "epochs=1", "imgsz=64", "batch=8", "workers=0", "device=cpu"]
    code = main([*argv, f"project={project}", "warmup_epochs=0"])
    return code, capsys.readouterr().err


def _error_lines(err):
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("error:")]


def _whole_lines(path):
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.decode().splitlines()]


def test_a_full_disk_at_a_checkpoint_is_one_line_and_the_checkpoint_before_stays(
    tiny_data, tmp_path, capsys, monkeypatch
):
    real, files = checkpoint._Recording.write, []

    def write(self, data):  # the second last.pt (the epoch's end) finds the disk full, after a first chunk
        if "last.pt" in self._f.name and id(self) not in files:
            files.append(id(self))
        if id(self) in files and files.index(id(self)) == 1:
            self.error = OSError(errno.ENOSPC, "No space left on device")
            raise self.error
        return real(self, data)

    monkeypatch.setattr(checkpoint._Recording, "write", write)
    code, err = _train(tiny_data, tmp_path, capsys)
    last = tmp_path / "exp" / "weights" / "last.pt"
    assert code == 2
    assert _error_lines(err) == [_error_lines(err)[0]] and _error_lines(err)[0].startswith(
        f"error: no space left on device writing {last} ("
    )
    assert _error_lines(err)[0].endswith(" MB free)")
    assert load_checkpoint(last)["epoch"] == 0  # the run's first last.pt, untouched
    assert not list(last.parent.glob(".*"))  # no temporary left
    for p in last.parent.iterdir():  # best.pt too, where the epoch's validation landed and wrote one
        load_checkpoint(p)
    events = _whole_lines(tmp_path / "exp" / "events.jsonl")
    assert events[-1]["type"] == "run_end" and events[-1]["status"] == "failed"


def test_a_full_disk_at_an_event_cuts_the_file_back_to_its_last_whole_line(tiny_data, tmp_path, capsys, monkeypatch):
    real, calls = EventWriter._os_write, [0]

    def write(fd, data):  # from the 6th event on the disk is full: half of the line lands, then ENOSPC
        calls[0] += 1
        if calls[0] >= 6:
            real(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(EventWriter, "_os_write", staticmethod(write))
    code, err = _train(tiny_data, tmp_path, capsys)
    path = tmp_path / "exp" / "events.jsonl"
    assert code == 2
    assert _error_lines(err) == [f"error: no space left on device writing {path} ({_free_mb(err)} MB free)"]
    events = _whole_lines(path)
    assert len(events) == 5 and events[0]["type"] == "run_start"


def _free_mb(err):
    return err.split(" (")[-1].split(" MB")[0]


def test_a_torchvision_built_for_another_torch_stops_the_run_before_its_first_step(
    tiny_data, tmp_path, capsys, monkeypatch
):
    def broken(*a):
        raise RuntimeError("operator torchvision::nms does not exist")

    monkeypatch.setattr(nms, "_nms", lambda: broken)
    with pytest.raises(InstallError) as e:
        nms.check_nms(torch.device("cpu"))
    from importlib.metadata import version

    assert f"torch {torch.__version__}" in str(e.value) and f"torchvision {version('torchvision')}" in str(e.value)
    assert "torchvision::nms does not exist" in str(e.value)
    code, err = _train(tiny_data, tmp_path, capsys)
    assert code == 2 and len(_error_lines(err)) == 1 and f"torch {torch.__version__}" in err
    assert not (tmp_path / "exp").exists()  # nothing was started
    from libreyolo import LibreYOLO

    image = next((tiny_data.parent / "images" / "val").glob("*.jpg"))
    with pytest.raises(InstallError):  # predict and val say the same, not a traceback at their first batch
        LibreYOLO("LibreYOLO9t").predict(str(image), imgsz=64, device="cpu")
    with pytest.raises(InstallError):
        LibreYOLO("LibreYOLO9t").val(data=str(tiny_data), imgsz=64, device="cpu", workers=0)


def test_the_pickle_refusal_names_what_it_met_without_torchs_advice(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    path = tmp_path / "evil.pt"
    torch.save({"x": Evil()}, path)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    msg = str(e.value)
    assert "refuses" in msg and "system" in msg
    assert "weights_only" not in msg and "\x1b" not in msg and "trusted" not in msg


def test_an_events_file_left_with_half_a_line_is_cut_back_when_opened_again(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"type": "heartbeat", "v": 4}\n{"type": "step", "v": 4, "epo')  # a process killed mid-line
    w = EventWriter(path)
    from libreyolo.events import Heartbeat

    w.write(Heartbeat(epoch=0, step=1, pid=1))
    w.close()
    assert [e["type"] for e in _whole_lines(path)] == ["heartbeat", "heartbeat"]


def test_a_project_folder_short_of_three_checkpoints_gets_a_warning_at_the_start(tiny_data, tmp_path, monkeypatch):
    """Less free space than three checkpoints (last.pt, the previous last.pt, best.pt): a warning before the first
    step names the folder, the space and a checkpoint's size; the run still trains (the disk may be freed)."""
    import shutil

    usage = shutil.disk_usage(tmp_path)
    short = usage._replace(free=40 * 2**20)  # 40 MB: a LibreYOLO9t last.pt is ~36 MB
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: short)
    from libreyolo import LibreYOLO
    from libreyolo.events import read_events

    m = LibreYOLO("LibreYOLO9t")
    m.train(data=str(tiny_data), project=str(tmp_path), epochs=1, imgsz=64, batch=8, workers=0, device="cpu",
            plots=False)  # fmt: skip
    events = list(read_events(m.last_run / "events.jsonl"))
    said = [e["message"] for e in events if e["type"] == "warning" and "less than three checkpoints" in e["message"]]
    assert len(said) == 1 and said[0].startswith(f"{m.last_run} has 40 MB free, less than three checkpoints")
    assert events.index(next(e for e in events if e["type"] == "step")) > events.index(
        next(e for e in events if e.get("message") == said[0])
    )
    assert events[-1]["status"] == "finished"
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: usage._replace(free=10 * 2**30))
    assert checkpoint.low_space_note(tmp_path, 36 * 2**20) is None


def test_a_last_pt_outside_a_weights_folder_is_refused_with_where_to_put_it(tiny_data, tmp_path):
    from libreyolo import LibreYOLO

    def stop(e):  # Ctrl-C after the first of two epochs: an unfinished run
        if e.type == "epoch_end":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        LibreYOLO("LibreYOLO9t").train(data=str(tiny_data), project=str(tmp_path), epochs=2, imgsz=64, batch=8,
                                       workers=0, device="cpu", plots=False, val=False, callbacks=[stop])  # fmt: skip
    loose = tmp_path / "last.pt"
    os.replace(tmp_path / "exp" / "weights" / "last.pt", loose)
    with pytest.raises(CheckpointError, match=r"is not in a run folder's weights/ .*put it at RUN/weights/last.pt"):
        LibreYOLO(loose).train(resume=str(loose))
