"""The CUDA driver's start beside `import torch` (cli/cudastart.py): which command lines start it, on which
device, and that it is harmless where there is no driver."""

import pytest

from libreyolo.cli import cudastart


@pytest.mark.parametrize(
    "argv,ordinal",
    [
        (["train"], 0),
        (["train", "data=x.yaml", "device=auto"], 0),
        (["train", "device=cuda"], 0),
        (["train", "device=2"], 2),
        (["train", "device=1", "device=3"], 3),  # the last one wins, as in the key parser
        (["val", "device=1"], 1),
        (["predict"], 0),
        (["bench", "step"], 0),
        (["bench", "val", "device=1"], 1),
        (["train", "device=cpu"], None),
        (["train", "device=MPS"], None),
        (["train", "device=0,1"], None),  # the DDP launcher's own process trains on no GPU
        (["bench", "loader"], None),
        (["bench"], None),
        (["data", "shapes"], None),
        (["train", "--help"], None),
        ([], None),
    ],
)
def test_which_command_lines_start_the_driver_and_on_which_device(argv, ordinal, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert cudastart.device_ordinal(argv) == ordinal


def test_a_torchrun_rank_starts_its_own_device(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert cudastart.device_ordinal(["train", "device=0,1,2,3"]) == 3
    assert cudastart.device_ordinal(["train", "device=cpu"]) is None


def test_the_thread_ends_quietly_without_a_driver_or_device(monkeypatch):
    """On this machine there may be no libcuda; a missing library or device is no error (torch reports its own)."""
    import ctypes
    import threading

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    errors = []
    monkeypatch.setattr(threading, "excepthook", errors.append)
    monkeypatch.setattr(ctypes, "CDLL", missing)
    t = cudastart.start(["train"])
    assert t is not None
    t.join(10)
    assert not t.is_alive() and errors == []
    assert cudastart.start(["train", "device=cpu"]) is None
