"""The kernel warm-up (engine/warmup.py): one training pass on a copy of the train net, its backward in a thread,
leaving no trace."""

import pytest
import torch
from conftest import FAST
from torch import nn

from libreyolo import LibreYOLO
from libreyolo.engine import builders
from libreyolo.engine import warmup as warmup_mod
from libreyolo.engine.checkpoint import load_checkpoint
from libreyolo.engine.lossscale import MAX_EXP, ScaleSearch, probe_loss_scale
from libreyolo.engine.passes import Peekable
from libreyolo.engine.setup import TrainSetup
from libreyolo.engine.step import EagerStep, train_forward
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


def test_the_loss_runs_beside_the_network_forward_on_example_outputs():
    """A family with example outputs: the loss's first call runs in a thread of its own on them, with the batch's
    targets, and ends before the real loss; the run's random stream and the net stay untouched."""
    import threading

    seen: list[tuple[str, tuple[int, ...], torch.dtype, bool]] = []

    def loss_fn(outputs, targets, mask, imgsz, scale):
        seen.append(
            (threading.current_thread().name, tuple(outputs[0].shape), outputs[0].dtype, targets is batch["targets"])
        )
        loss = outputs[0].float().square().mean() * scale
        return loss, loss.detach()[None]

    def example(train, b, imgsz, dtype, device, mask):
        assert isinstance(train, Dropping) and device == torch.device("cpu") and mask is batch["mask"]
        return (torch.randn(b, 4, imgsz[0] - 2, imgsz[1] - 2, dtype=dtype, requires_grad=True),)

    batch = _batch(2, 16)
    torch.manual_seed(3)
    net = Dropping().train()
    rng = torch.get_rng_state()
    w = KernelWarmup(lambda: batch, loss_fn, torch.device("cpu"), loss_beside=(loss_fn, example))
    w.start(net, None, False, 1.0)
    w.join()
    assert w.error is None
    assert seen == [
        ("libreyolo-warmup-loss", (2, 4, 14, 14), torch.float32, True),
        (threading.current_thread().name, (2, 4, 14, 14), torch.float32, True),
    ]
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in net.parameters())


def test_a_failing_loss_beside_leaves_the_pass_to_the_real_loss():
    def example(*a):
        raise RuntimeError("no example")

    w = KernelWarmup(lambda: _batch(2, 16), _sum_loss, torch.device("cpu"), loss_beside=(_sum_loss, example))
    w.start(Dropping().train(), None, False, 1.0)
    w.join()
    assert w.error is None and w.failure is None


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_a_family_s_example_outputs_are_shaped_as_its_train_net_s_forward(dtype):
    """Every family that declares example outputs: the same structure, shapes and dtype as a real training forward
    of a batch with targets (a non-square input, with and without autocast; RT-DETR's denoising queries follow the
    most boxes in one image)."""
    from libreyolo.config import TrainConfig
    from libreyolo.engine.step import feed_targets
    from libreyolo.families import families

    def flat(out):
        if isinstance(out, dict):
            return sorted(out), [out[k] for k in sorted(out)]
        return None, list(out) if isinstance(out, (tuple, list)) else [out]

    declared = [f for f in families().values() if f.example_outputs is not None]
    assert {"yolo9", "yolox", "resnet", "mnv4", "rtdetr"} <= {f.name for f in declared}
    img = torch.randint(0, 255, (2, 96, 64, 3), dtype=torch.uint8)
    targets = torch.tensor([[0.0, 4, 4, 30, 40], [1, 10, 50, 60, 90], [2, 0, 0, 64, 96]]).repeat(2, 1, 1)
    for mask in (torch.tensor([[True, True, False], [True, False, False]]), torch.zeros(2, 3, dtype=torch.bool)):
        for fam in declared:
            cfg = TrainConfig.from_overrides({"model": fam.prefix + fam.sizes[0], "imgsz": 96})
            net = fam.build(fam.sizes[0], 3)
            train = fam.train_net(net, cfg).train()
            feed_targets(train, targets, mask, (96, 64))
            real_keys, real = flat(train_forward(train, img, dtype, False))
            out = fam.example_outputs(train, 2, (96, 64), dtype or torch.float32, torch.device("cpu"), mask)
            keys, example = flat(out)
            assert keys == real_keys, fam.name
            assert [(tuple(t.shape), t.dtype) for t in example] == [(tuple(t.shape), t.dtype) for t in real], fam.name
            assert all(t.requires_grad and t.is_leaf for t in example), fam.name
            loss, _ = fam.loss(net, cfg, None)(out, targets, mask, (96, 64), 1.0)
            loss.backward()  # what the warm-up's thread runs: the loss takes the example outputs, and back
            assert torch.isfinite(loss) and any(t.grad is not None for t in example), fam.name


class HalfOut(nn.Module):
    """float32 weights, float16 outputs whose gradients overflow float16 above some loss scale."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.w = nn.Parameter(torch.full((8,), 0.5))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        h = self.bn(self.conv(x)).half()
        return (h * self.w.half()[None, :, None, None] * 100.0,)


def _sum_loss(outputs, targets, mask, imgsz, scale):
    loss = outputs[0].float().sum() * scale
    return loss, loss.detach()[None]


def test_the_warm_up_reads_the_start_scale_off_its_batch_as_the_first_step_probe_does(monkeypatch):
    """The warm-up's copy has the train net's weights and runs on the run's first batch: the scale search on it
    (its passes in the warm-up's thread) finds what the probe on the train net itself finds."""
    import threading

    torch.manual_seed(0)
    net = HalfOut().train()
    batch = _batch(4, 16)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    passes: list[str] = []
    real_grad = torch.autograd.grad
    monkeypatch.setattr(
        torch.autograd, "grad", lambda *a, **k: passes.append(threading.current_thread().name) or real_grad(*a, **k)
    )
    w = KernelWarmup(lambda: batch, _sum_loss, torch.device("cpu"), ScaleSearch())
    w.start(net, None, False, 4.0)
    w.join()
    assert w.error is None and w.scale is not None
    warm_passes, passes[:] = list(passes), []
    expected = probe_loss_scale(
        net,
        lambda img: train_forward(net, img, None, False),
        _sum_loss,
        [p for p in net.parameters() if p.requires_grad],
        batch["img"],
        batch["targets"],
        batch["mask"],
        4.0,
    )
    assert w.scale == expected and expected[1] is not None and 0 < expected[1] < MAX_EXP
    assert len(warm_passes) >= 2 and set(warm_passes) == {"libreyolo-warmup"}
    assert all(p.grad is None for p in net.parameters())  # nothing accumulated, on the copy or the net
    for k, v in net.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0, msg=k)


def test_the_warm_up_s_scale_is_set_on_the_scaler_before_the_first_batch():
    from types import SimpleNamespace

    scaler = torch.amp.GradScaler("cpu", init_scale=65536.0)
    s = SimpleNamespace(warm_scale=(8.0, 4), scaler=scaler)
    scale, why = TrainSetup.start_scale(s, None, None, None)  # type: ignore[arg-type]
    assert scale == 8.0 and scaler.get_scale() == 8.0
    assert why == "loss scale starts at 8: the first batch's float16 gradients are finite up to 2^4"


def test_a_peeked_first_batch_is_still_the_first_one_the_pass_returns():
    p = Peekable(iter([1, 2, 3]))
    assert p.peek() == 1 and p.peek() == 1
    assert list(p) == [1, 2, 3]
    with pytest.raises(StopIteration):
        Peekable(iter([])).peek()


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


@pytest.mark.parametrize("model", ["LibreYOLO9t", "LibreRTDETRr18"])
def test_a_run_with_the_warm_up_trains_exactly_as_one_without(tiny_data, tmp_path, monkeypatch, model):
    """The warm-up (forced on here, on the CPU) must change nothing the run computes; the loss ran beside the
    forward (RT-DETR's too: its denoising draws noise in the forward, none in the loss)."""
    passes, warm_imgs, step_imgs = [], [], []
    orig, orig_step = KernelWarmup._forward, EagerStep.__call__

    def counted(self, *a):
        passes.append(a[0].training)
        warm_imgs.append(self.make_batch()["img"].clone())
        return orig(self, *a)

    def step(self, img, *a, **k):
        step_imgs.append(img.clone())
        return orig_step(self, img, *a, **k)

    def run(name: str) -> dict[str, torch.Tensor]:
        m = LibreYOLO(model)
        m.train(**{**FAST, "data": str(tiny_data), "project": str(tmp_path), "name": name, "epochs": 1, "seed": 1})
        return load_checkpoint(tmp_path / name / "weights" / "last.pt")["model"]

    beside = []
    orig_beside = warmup_mod.loss_beside

    def counted_beside(*a):
        thread = orig_beside(*a)
        beside.append(thread)
        return thread

    plain = run("plain")
    monkeypatch.setattr(builders, "warmup_wanted", lambda device, world_size, cudnn_benchmark: True)
    monkeypatch.setattr(KernelWarmup, "_forward", counted)
    monkeypatch.setattr(warmup_mod, "loss_beside", counted_beside)
    monkeypatch.setattr(EagerStep, "__call__", step)
    warmed = run("warmed")
    assert passes == [True]
    assert len(beside) == 1 and beside[0] is not None  # the loss also ran beside the forward
    assert torch.equal(warm_imgs[0], step_imgs[0])  # the warm-up ran on the run's first batch (read ahead)
    for k in plain:
        torch.testing.assert_close(warmed[k], plain[k], rtol=0, atol=0, msg=k)


def test_a_failed_warm_up_is_a_setup_warning_and_the_run_goes_on(tiny_data, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(builders, "warmup_wanted", lambda device, world_size, cudnn_benchmark: True)

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

    def slow(self, loss, inputs, t):
        time.sleep(0.5)  # the restore runs meanwhile
        return orig_backward(self, loss, inputs, t)

    def restore(self, ckpt):
        thread = self.s.kernel_warmup._thread
        overlapped.append(thread is not None and thread.is_alive())
        return orig_restore(self, ckpt)

    monkeypatch.setattr(builders, "warmup_wanted", lambda device, world_size, cudnn_benchmark: True)
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
