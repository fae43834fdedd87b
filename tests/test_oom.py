"""Out of device memory ends a run with a clear LibreYOLOError (libreyolo/oom.py), not torch's traceback: the CLI prints
one `error:` block and exits 2, the API raises DeviceMemoryError chained to torch's, and a resumed run's last.pt is
left as it was. The OOM is faked on the CPU with torch's own message text."""

import hashlib
import json
import signal
from types import SimpleNamespace

import pytest
import torch
from conftest import FAST

from libreyolo import LibreYOLO, errors, oom
from libreyolo.cli.main import main
from libreyolo.engine import trainer as trainer_mod
from libreyolo.errors import DeviceMemoryError, LibreYOLOError
from libreyolo.events import read_events

# torch >= 2.4's CUDACachingAllocator message, with NVML's process list (proc_info) and a CUDA graph's private pool
FULL = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.72 GiB of which 1.20 GiB is "
    "free. Process 1234 has 130.00 GiB memory in use. Process 987 has 512.00 MiB memory in use. Including non-PyTorch "
    "memory, this process has 8.50 GiB memory in use. Of the allocated memory 7.90 GiB is allocated by PyTorch, "
    "with 1.00 GiB allocated in private pools (e.g., CUDA Graphs), and 112.00 MiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
    "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
# the same allocator built without NVML: no process list
NO_PROCS = (
    "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 1 has a total capacity of 15.77 GiB of which 4.06 MiB is "
    "free. Of the allocated memory 14.20 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)
# a cuBLAS/cuDNN workspace or the driver itself: no figures at all
RAW = "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call"


def _oom(*args, **kwargs):
    raise torch.OutOfMemoryError(FULL)


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_parse_oom_reads_every_figure_of_torchs_message():
    f = oom.parse_oom(FULL)
    assert (f.needed, f.gpu, f.free) == (2 * 2**30, 0, int(1.2 * 2**30))
    assert f.total == int(139.72 * 2**30)
    assert f.this_process == int(8.5 * 2**30)
    assert f.allocated == int(7.9 * 2**30) and f.reserved == f.allocated + 112 * 2**20
    assert [(p["pid"], p["used_mb"]) for p in f.others] == [(1234, 130 * 1024.0), (987, 512.0)]


def test_parse_oom_with_parts_missing():
    f = oom.parse_oom(NO_PROCS)
    assert (f.needed, f.gpu, f.free) == (20 * 2**20, 1, int(4.06 * 2**20))
    assert f.others == [] and not f.others_known and f.this_process is None
    assert f.reserved == int(14.2 * 2**30) + int(1.1 * 2**30)
    raw = oom.parse_oom(RAW)
    assert raw == oom.OomFacts()  # nothing to read: the message falls back to what the device says, if anything
    short = oom.parse_oom("CUDA out of memory. Tried to allocate 512.00 MiB")
    assert short.needed == 512 * 2**20 and short.free is None and short.total is None


def test_message_names_the_run_the_numbers_and_what_to_change():
    text = oom.explain(torch.OutOfMemoryError(FULL), oom.RunSpec("training", "LibreYOLO9t", 64, 640, "0"))
    head = text.splitlines()[0]
    assert "cuda:0" in head and "batch=64" in head and "imgsz=640" in head and "LibreYOLO9t" in head
    assert "2.00 GiB" in head and "1.20 GiB" in head and "139.72 GiB" in head
    assert "8.50 GiB" in text and "pid 1234" in text and "130.50 GiB" in text  # who holds the rest
    assert "batch=32" in text and "batch=-1" in text and "imgsz=480" in text
    assert "free the GPU" in text  # other processes hold most of it
    # the profile command's flags; a batch autobatch picked is not answered with autobatch again
    spec = oom.RunSpec("profiling", "LibreYOLO9t", 64, 640, "auto", autobatched=True, flags=oom.PROFILE)
    text = oom.explain(torch.OutOfMemoryError(NO_PROCS), spec)
    assert "--batch 32" in text and "--imgsz 480" in text and "--batch -1" not in text and "autobatch sized" in text
    assert "expandable_segments" in text  # 1.10 GiB cached but unallocated, more than the 20 MiB it needed
    # nothing to parse, no CUDA device to ask: still the run and the advice
    spec = oom.RunSpec("validating", "LibreYOLO9s", 16, 320, "cpu", flags=oom.NO_AUTOBATCH)
    text = oom.explain(RuntimeError(RAW), spec)
    assert "batch=16" in text and "batch=8" in text and "imgsz=224" in text and "batch=-1" not in text


def test_explained_passes_other_errors_through():
    with pytest.raises(ValueError), oom.explained(lambda: oom.RunSpec("training", "m", 8, 64, "cpu")):
        raise ValueError("not memory")
    with pytest.raises(RuntimeError, match="other"), oom.explained(lambda: oom.RunSpec("training", "m", 8, 64, "cpu")):
        raise RuntimeError("other")
    already = DeviceMemoryError("rank 0: out of memory on cuda:0 ...")
    with pytest.raises(DeviceMemoryError) as e, oom.explained(lambda: oom.RunSpec("training", "m", 8, 64, "cpu")):
        raise already
    assert e.value is already
    # a description that fails still gives the numbers
    with pytest.raises(DeviceMemoryError, match="2.00 GiB") as e, oom.explained(lambda: 1 / 0):
        raise torch.OutOfMemoryError(FULL)
    assert isinstance(e.value.__cause__, torch.OutOfMemoryError)


def test_api_train_raises_a_clear_error(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_mod, "build_run", _oom)  # as the EMA's deep copy in the setup would
    with pytest.raises(DeviceMemoryError) as e:
        LibreYOLO("LibreYOLO9t").train(data=str(tiny_data), project=str(tmp_path), epochs=1, **FAST)
    assert isinstance(e.value, LibreYOLOError) and isinstance(e.value.__cause__, torch.OutOfMemoryError)
    text = str(e.value)
    assert "training LibreYOLO9t at batch=8 imgsz=64" in text
    assert "allocation of 2.00 GiB failed with 1.20 GiB" in text
    assert "batch=4 (half the batch)" in text and "batch=-1" in text


def test_api_val_raises_a_clear_error(tiny_data, monkeypatch):
    from libreyolo import val as eval_run

    monkeypatch.setattr(eval_run, "resolve_amp", _oom)
    with pytest.raises(DeviceMemoryError) as e:
        LibreYOLO("LibreYOLO9t", nc=3).val(str(tiny_data), batch=8, imgsz=64, device="cpu", workers=0)
    text = str(e.value)
    assert "validating LibreYOLO9t at batch=8 imgsz=64" in text and "batch=4" in text
    assert "batch=-1" not in text  # validation has no autobatch


@pytest.fixture
def keep_signals():
    """`libreyolo train` installs SIGTERM/SIGINT handlers for its process: put pytest's back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_cli_train_prints_one_error_without_traceback(tiny_data, tmp_path, monkeypatch, capsys, keep_signals):
    monkeypatch.setattr(trainer_mod, "build_run", _oom)
    argv = ["train", f"data={tiny_data}", "imgsz=64", "epochs=1", "batch=4", "device=cpu", "workers=0"]
    assert main([*argv, f"project={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: out of memory on cuda:0 while training LibreYOLO9t at batch=4 imgsz=64")
    assert "Traceback" not in err and "batch=2" in err and "batch=-1" in err


def test_cli_profile_and_bench_name_their_own_flags(tiny_data, tmp_path, monkeypatch, capsys):
    from libreyolo.bench import step

    monkeypatch.setattr(trainer_mod, "build_run", _oom)
    argv = ["profile", "run", str(tiny_data), "--device", "cpu", "--batch", "4", "--imgsz", "64", "--workers", "0"]
    assert main([*argv, "--project", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: out of memory") and "Traceback" not in err
    assert "profiling LibreYOLO9t at batch=4 imgsz=64" in err and "--batch 2" in err and "--batch -1" in err

    monkeypatch.setattr(step, "_batch_on_device", _oom)
    assert main(["bench", "step", "device=cpu", "batch=4", "imgsz=64", "modes=eager"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: out of memory") and "Traceback" not in err
    assert "batch=4 imgsz=64" in err and "batch=2" in err and "batch=-1" not in err


class _StopAfterEpoch:
    """Module-level so it is an ordinary callback: Ctrl-C once epoch `n` has ended (last.pt is then written)."""

    def __init__(self, n):
        self.n = n

    def __call__(self, e):
        if e.type == "epoch_end" and e.epoch == self.n:
            raise KeyboardInterrupt


def test_resumed_run_that_runs_out_of_memory_leaves_last_pt_untouched(tiny_data, tmp_path, monkeypatch):
    args = {**FAST, "data": str(tiny_data), "project": str(tmp_path), "batch": 4, "val": False}
    with pytest.raises(KeyboardInterrupt):
        LibreYOLO("LibreYOLO9t").train(epochs=2, callbacks=[_StopAfterEpoch(0)], **args)
    last = tmp_path / "exp" / "weights" / "last.pt"
    before = _sha(last)

    real = trainer_mod.Trainer.restore

    def restore_then_oom_in_the_step(trainer, ckpt):
        real(trainer, ckpt)
        trainer.s.step = _oom  # the resumed run's first step runs out of memory

    monkeypatch.setattr(trainer_mod.Trainer, "restore", restore_then_oom_in_the_step)
    with pytest.raises(DeviceMemoryError, match="batch=4 imgsz=64") as e:
        LibreYOLO(last).train(resume=True, model=str(last))
    assert _sha(last) == before
    # batch and imgsz are fixed on resume: the advice says so instead of offering batch=2 for this run
    assert "a resumed run keeps its batch and imgsz" in str(e.value) and f"model={last}" in str(e.value)
    events = list(read_events(tmp_path / "exp" / "events.jsonl"))
    assert [e["type"] for e in events][-2:] == ["error", "run_end"] and events[-1]["status"] == "failed"
    assert "OutOfMemoryError" in events[-2]["message"]


def test_a_ddp_ranks_error_comes_back_as_the_same_clear_error(tmp_path):
    """The spawn launcher re-raises a rank's LibreYOLOError by its class name in libreyolo.errors."""
    from libreyolo import launch

    spec = oom.RunSpec("training", "LibreYOLO9t", 64, 640, "0,1", world_size=2)
    text = oom.explain(torch.OutOfMemoryError(FULL), spec)
    assert "batch=64 (32 per GPU x 2)" in text
    (tmp_path / "error-rank1.json").write_text(json.dumps({"type": "DeviceMemoryError", "message": text}))
    ctx = SimpleNamespace(processes=[SimpleNamespace(exitcode=None), SimpleNamespace(exitcode=1)])
    failed = launch._failure(SimpleNamespace(error_index=1), tmp_path, ctx)
    assert type(failed) is errors.DeviceMemoryError and str(failed) == f"rank 1: {text}"
