"""The kernel warm-up (engine/warmup.py): one training pass on a copy of the train net, its backward in a thread,
leaving no trace."""

import torch
from conftest import FAST
from torch import nn

from libreyolo import LibreYOLO
from libreyolo.engine import setup as setup_mod
from libreyolo.engine.checkpoint import load_checkpoint
from libreyolo.engine.warmup import KernelWarmup, warmup_wanted


class Dropping(nn.Module):
    """A train-mode forward that draws random numbers and updates BatchNorm buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.drop(self.bn(self.conv(x))),)


def _batch(b: int = 2, size: int = 16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "img": torch.randint(0, 255, (b, size, size, 3), dtype=torch.uint8, generator=g),
        "targets": torch.zeros(b, 1, 5),
        "mask": torch.ones(b, 1, dtype=torch.bool),
    }


def test_the_pass_runs_the_loss_and_leaves_no_trace():
    torch.manual_seed(3)
    net = Dropping().train()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    calls = []

    def loss_fn(outputs, targets, mask, imgsz, scale):
        calls.append((tuple(outputs[0].shape), imgsz, scale, torch.is_grad_enabled()))
        loss = outputs[0].float().square().mean() * scale
        return loss, loss.detach()[None]

    rng = torch.get_rng_state()
    w = KernelWarmup(lambda: _batch(2, 16), loss_fn, torch.device("cpu"))
    w.start(net, None, False, 4.0)
    w.join()
    w.join()  # again: nothing left to wait for
    assert w.error is None and w.failure is None
    assert calls == [((2, 4, 14, 14), (16, 16), 4.0, True)]
    assert w.seconds is not None and w.seconds > 0
    # the copy trained, not the net: no gradients, BatchNorm statistics as they were, the random stream untouched
    assert all(p.grad is None for p in net.parameters())
    for k, v in net.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0, msg=k)
    assert torch.equal(torch.get_rng_state(), rng)


def test_the_forward_and_loss_run_here_and_the_backward_in_the_thread():
    """cuDNN's forward plans are cached per thread: the caller's own; the backward leaves the caller free."""
    import threading

    where: dict[str, threading.Thread] = {}

    def loss_fn(outputs, targets, mask, imgsz, scale):
        where["loss"] = threading.current_thread()
        outputs[0].register_hook(lambda g: where.setdefault("backward", threading.current_thread()))
        loss = outputs[0].float().mean()
        return loss, loss.detach()[None]

    w = KernelWarmup(lambda: _batch(2, 16), loss_fn, torch.device("cpu"))
    w.start(Dropping().train(), None, False, 1.0)
    assert where["loss"] is threading.current_thread()
    w.join()
    assert where["backward"] is not threading.current_thread() and where["backward"].name == "libreyolo-warmup"


def test_the_kept_copy_is_handed_on_once():
    net = Dropping().train()
    w = KernelWarmup(lambda: _batch(2, 16), lambda o, *a: (o[0].float().mean(), None), torch.device("cpu"))
    w.start(net, None, False, 1.0, keep=net.bn)
    kept = w.take_copy()
    assert isinstance(kept, nn.BatchNorm2d) and kept is not net.bn
    assert not kept.training and all(not p.requires_grad and p.grad is None for p in kept.parameters())
    torch.testing.assert_close(kept.weight, net.bn.weight, rtol=0, atol=0)
    assert w.take_copy() is None


def test_a_failure_is_recorded_not_raised():
    def broken() -> dict[str, torch.Tensor]:
        raise ValueError("no images")

    w = KernelWarmup(broken, lambda *a: None, torch.device("cpu"))  # type: ignore[arg-type, return-value]
    w.start(Dropping(), None, False, 1.0)
    w.join()
    assert isinstance(w.error, ValueError)
    assert w.failure is not None and "ValueError: no images" in w.failure and "warm-up" in w.failure


def test_only_one_cuda_process_without_algorithm_timing_warms_up():
    assert warmup_wanted(torch.device("cuda", 0), 1, cudnn_benchmark=False)
    assert not warmup_wanted(torch.device("cuda", 0), 2, cudnn_benchmark=False)  # DDP: SyncBatchNorm is a collective
    assert not warmup_wanted(torch.device("cuda", 0), 1, cudnn_benchmark=True)  # timing beside the setup's kernels
    assert not warmup_wanted(torch.device("cpu"), 1, cudnn_benchmark=False)
    assert not warmup_wanted(torch.device("mps"), 1, cudnn_benchmark=False)


def test_a_run_with_the_warm_up_trains_exactly_as_one_without(tiny_data, tmp_path, monkeypatch):
    """The warm-up (forced on here, on the CPU) must change nothing the run computes."""
    passes = []
    orig = KernelWarmup._forward

    def counted(self, *a):
        passes.append(a[0].training)
        return orig(self, *a)

    def run(name: str) -> dict[str, torch.Tensor]:
        m = LibreYOLO("LibreYOLO9t")
        m.train(**{**FAST, "data": str(tiny_data), "project": str(tmp_path), "name": name, "epochs": 1, "seed": 1})
        return load_checkpoint(tmp_path / name / "weights" / "last.pt")["model"]

    plain = run("plain")
    monkeypatch.setattr(setup_mod, "warmup_wanted", lambda device, world_size, cudnn_benchmark: True)
    monkeypatch.setattr(KernelWarmup, "_forward", counted)
    warmed = run("warmed")
    assert passes == [True]
    for k in plain:
        torch.testing.assert_close(warmed[k], plain[k], rtol=0, atol=0, msg=k)


def test_a_failed_warm_up_is_a_setup_warning_and_the_run_goes_on(tiny_data, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(setup_mod, "warmup_wanted", lambda device, world_size, cudnn_benchmark: True)

    def fail(self, *a):
        raise RuntimeError("simulated")

    monkeypatch.setattr(KernelWarmup, "_forward", fail)
    m = LibreYOLO("LibreYOLO9t")
    m.train(**{**FAST, "data": str(tiny_data), "project": str(tmp_path), "epochs": 1, "callbacks": [seen.append]})
    warnings = [e.message for e in seen if e.type == "warning" and "warm-up" in e.message]
    assert warnings == [
        "the first pass's warm-up failed (RuntimeError: simulated); the first step loads the GPU libraries itself"
    ]
    assert [e.status for e in seen if e.type == "run_end"] == ["finished"]


def test_a_resumed_run_restores_beside_the_warm_up_s_backward(tiny_data, tmp_path, monkeypatch):
    """The backward may still run while the setup restores the checkpoint: the resumed run still matches the
    uninterrupted one (both warmed up), bit for bit."""
    import time

    from test_train import _StopAfterEpoch, _train

    from libreyolo.engine.trainer import Trainer

    orig_backward, orig_restore = KernelWarmup._backward, Trainer.restore
    overlapped = []

    def slow(self, loss, t):
        time.sleep(0.5)  # the restore runs meanwhile
        return orig_backward(self, loss, t)

    def restore(self, ckpt):
        thread = self.s.kernel_warmup._thread
        overlapped.append(thread is not None and thread.is_alive())
        return orig_restore(self, ckpt)

    monkeypatch.setattr(setup_mod, "warmup_wanted", lambda device, world_size, cudnn_benchmark: True)
    monkeypatch.setattr(KernelWarmup, "_backward", slow)
    monkeypatch.setattr(Trainer, "restore", restore)
    _train(tiny_data, tmp_path / "a", epochs=2, workers=0)
    try:
        _train(tiny_data, tmp_path / "b", epochs=2, workers=0, callbacks=[_StopAfterEpoch(0)])
    except KeyboardInterrupt:
        pass
    last = tmp_path / "b" / "exp" / "weights" / "last.pt"
    LibreYOLO(last).train(resume=True, model=str(last))
    assert overlapped == [True]
    a = load_checkpoint(tmp_path / "a" / "exp" / "weights" / "last.pt")["model"]
    b = load_checkpoint(last)["model"]
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=k)
