"""CPU tests of the AMP policy and the CUDA-graph manager's decisions (the GPU side: test_graphs_gpu.py)."""

import copy
from types import SimpleNamespace

import pytest
import torch
from conftest import FAST

from libreyolo import LibreYOLO
from libreyolo import events as ev
from libreyolo.amp import resolve_amp
from libreyolo.config import TrainConfig
from libreyolo.engine import optim
from libreyolo.engine.capturable import CapturableUpdate
from libreyolo.engine.checkpoint import FORMAT, load_checkpoint, save_atomic
from libreyolo.engine.flat import FlatParams
from libreyolo.engine.graphs import GraphRunner
from libreyolo.engine.runners import graph_mode, select_step
from libreyolo.engine.snapshot import snapshot
from libreyolo.engine.state import restore_train_state, train_state
from libreyolo.errors import ConfigError
from libreyolo.events import read_events
from libreyolo.families import NO_CAPTURE, WHOLE_NET, CapturePlan

CUDA = torch.device("cuda")
CPU = torch.device("cpu")


def test_amp_policy_per_dtype_and_device():
    fp16 = resolve_amp(True, "float16", CUDA, bf16_supported=lambda: True)
    assert (fp16.enabled, fp16.dtype, fp16.scaler, fp16.autocast_dtype) == (True, "float16", True, torch.float16)
    bf16 = resolve_amp(True, "bfloat16", CUDA, bf16_supported=lambda: True)
    assert (bf16.enabled, bf16.scaler, bf16.autocast_dtype) == (True, False, torch.bfloat16)
    cpu = resolve_amp(True, "float16", CPU)
    assert not cpu.enabled and not cpu.scaler and "cpu" in cpu.reason
    assert not resolve_amp(False, "bfloat16", CUDA).enabled


def test_bf16_on_a_device_without_it_raises_at_setup():
    with pytest.raises(ConfigError, match=r"amp_dtype='bfloat16' requires a CUDA device with BF16 support"):
        resolve_amp(True, "bfloat16", CUDA, bf16_supported=lambda: False)


class _Fam:
    name, capture = "fake", CapturePlan(("",), full_step=False)


NET_ONLY = CapturePlan(("",), full_step=False)
PARTS = CapturePlan(("backbone", "encoder"), full_step=False)


@pytest.mark.parametrize(
    "setting,device,world,plan,mode,needle",
    [
        # auto: the fastest path the family and the run allow
        ("auto", CUDA, 1, WHOLE_NET, "full", "whole step in one graph"),
        ("auto", CUDA, 1, NET_ONLY, True, "network in a graph"),
        ("auto", CUDA, 1, PARTS, True, "network in a graph"),
        ("auto", CUDA, 1, NO_CAPTURE, False, "has no capture plan"),
        ("auto", CPU, 1, WHOLE_NET, False, "need a CUDA device; training eager on cpu"),
        ("auto", torch.device("mps"), 1, WHOLE_NET, False, "training eager on mps"),
        # explicit values keep their meaning
        (False, CUDA, 1, WHOLE_NET, False, "cuda_graph=false"),
        (True, CUDA, 1, WHOLE_NET, True, "cuda_graph=true: the network in a graph"),
        ("full", CUDA, 1, WHOLE_NET, "full", "cuda_graph=full: the whole step"),
        ("full", CUDA, 1, NET_ONLY, True, "does not support whole-step capture; the network in a graph instead"),
        ("full", CUDA, 1, PARTS, True, "the network in a graph instead"),
        (True, CPU, 1, WHOLE_NET, False, "need a CUDA device"),
    ],
)
def test_cuda_graph_decision_table(setting, device, world, plan, mode, needle):
    fam = _Fam()
    fam.capture = plan
    got, why = graph_mode(setting, fam, device, world)
    assert got == mode and needle in why, why
    assert why.startswith(f"cuda_graph={'auto' if setting == 'auto' else str(setting).lower()}")


@pytest.mark.parametrize(
    "setting,world,backend,nccl,plan,mode,needle",
    [
        # DDP over NCCL: the graphs apply, with the gradient all-reduce inside the whole-step graph
        ("auto", 2, "nccl", (2, 21, 5), WHOLE_NET, "full", "under DDP (2 processes, NCCL)"),
        ("auto", 1, "nccl", (2, 21, 5), WHOLE_NET, "full", "gradient all-reduce inside the graph"),
        ("auto", 2, "nccl", (2, 21, 5), NET_ONLY, True, "network in a graph under DDP"),
        ("full", 2, "nccl", (2, 21, 5), WHOLE_NET, "full", "whole step in one graph under DDP"),
        (True, 4, "nccl", (2, 9, 6), WHOLE_NET, True, "network in a graph under DDP (4 processes"),
        # Gloo collectives cannot be captured; an NCCL older than 2.9.6 cannot be either
        ("auto", 2, "gloo", None, WHOLE_NET, False, "need the NCCL backend (this run uses gloo); training eager"),
        ("full", 2, "gloo", None, WHOLE_NET, False, "need the NCCL backend"),
        ("auto", 2, "nccl", (2, 8, 4), WHOLE_NET, False, "this torch has NCCL 2.8.4; training eager"),
    ],
)
def test_cuda_graph_decision_under_ddp(setting, world, backend, nccl, plan, mode, needle):
    fam = _Fam()
    fam.capture = plan
    got, why = graph_mode(setting, fam, CUDA, world, backend, nccl)
    assert got == mode and needle in why, why


@pytest.mark.parametrize("setting", ["full", True])
def test_explicit_graphs_under_ddp_with_an_old_nccl_is_a_clear_error(setting):
    fam = _Fam()
    fam.capture = WHOLE_NET
    with pytest.raises(ConfigError, match=r"NCCL 2\.9\.6 on; this torch has NCCL 2\.8\.4.*cuda_graph=false"):
        graph_mode(setting, fam, CUDA, 2, "nccl", (2, 8, 4))


@pytest.mark.parametrize(
    "device,world,plan,mode,needle",
    [
        (CPU, 1, WHOLE_NET, True, "need a CUDA device; training eager on cpu"),
        (CUDA, 1, NO_CAPTURE, True, "family has no capture plan"),
    ],
)
def test_unusable_explicit_cuda_graph_falls_back_with_one_event(device, world, plan, mode, needle):
    fam = _Fam()
    fam.capture = plan
    cfg = TrainConfig.from_overrides({"cuda_graph": mode})
    seen = []
    eager = object()
    runner, used, why = select_step(eager, None, cfg, fam, device, world, seen.append)
    assert runner is eager and used is False and needle in why
    assert len(seen) == 1 and seen[0].type == "graph" and seen[0].action == "fallback" and needle in seen[0].reason


def test_auto_that_finds_nothing_to_capture_emits_no_fallback_event():
    seen = []
    eager = object()
    runner, used, why = select_step(eager, None, TrainConfig.from_overrides({}), _Fam(), CPU, 1, seen.append)
    assert runner is eager and used is False and "eager on cpu" in why and not seen


def test_cpu_training_with_cuda_graph_trains_eager_with_one_line(tiny_data, tmp_path):
    m = LibreYOLO("LibreYOLO9t")
    m.train(**{**FAST, "data": str(tiny_data), "project": str(tmp_path), "epochs": 1, "cuda_graph": "full"})
    events = list(read_events(m.last_run / "events.jsonl"))
    graph = [e for e in events if e["type"] == "graph"]
    assert [g["action"] for g in graph] == ["fallback"] and events[-1]["status"] == "finished"
    assert events[0]["type"] == "run_start"  # held back until run_start was written


class _FakeRunner(GraphRunner):
    """Drives the shape bookkeeping on the CPU: 'capture' returns a token, 'replay' records it."""

    def __init__(self, fail_capture: bool = False, lower=None, fail_replay: bool = False):
        self.log = []
        self.fail, self.fail_replay = fail_capture, fail_replay
        super().__init__(eager=SimpleNamespace(skipped=None), emit=self.log.append, device=CPU, lower=lower)
        self.ran = []
        self.handed_over = 0

    def hand_over(self):
        self.handed_over += 1

    def run_eager(self, img, targets, mask, boundary, phases):
        self.ran.append(("eager", tuple(img.shape)))
        return torch.zeros(3)

    def capture(self, key, img, targets, mask, boundary):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        return key

    def replay(self, graph, img, targets, mask, boundary, phases):
        if self.fail_replay:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        self.ran.append(("graph", graph))
        return torch.zeros(3)


def _step(r, shape):
    r(torch.zeros(shape), torch.zeros(shape[0], 4, 5), torch.zeros(shape[0], 4, dtype=torch.bool), True)


def test_shape_counter_captures_the_third_consecutive_repeat_and_runs_others_eager():
    r = _FakeRunner()
    A, B, C = (8, 64, 64, 3), (8, 96, 96, 3), (3, 64, 64, 3)
    for s in (A, B, A, A, A, A, C, A, B, B):
        _step(r, s)
    kinds = [k for k, _ in r.ran]
    # A, B, A, A eager; the 3rd consecutive A (5th step) is captured and replayed; C and B eager
    assert kinds == ["eager", "eager", "eager", "eager", "graph", "graph", "eager", "graph", "eager", "eager"]
    assert list(r.graphs) == [A]
    caps = [e for e in r.log if e.action == "capture"]
    assert len(caps) == 1 and caps[0].shape == list(A)
    assert {tuple(e.shape) for e in r.log if e.action == "eager_shape"} == {C, B}


def test_capture_failure_switches_to_eager_for_the_rest_with_one_event():
    r = _FakeRunner(fail_capture=True)
    for _ in range(6):
        _step(r, (8, 64, 64, 3))
    assert [k for k, _ in r.ran] == ["eager"] * 6
    falls = [e for e in r.log if e.action == "fallback"]
    assert len(falls) == 1 and "capture failed (RuntimeError" in falls[0].reason and r.disabled
    ev.validate_event(falls[0].to_dict())


class _Lower(_FakeRunner):
    mode = "network"


@pytest.mark.parametrize("failing", ["capture", "replay"])
def test_a_failed_whole_step_steps_down_to_the_network_graph_with_one_event(failing):
    lowers = []

    def make_lower():
        lowers.append(_Lower())
        return lowers[-1]

    r = _FakeRunner(fail_capture=failing == "capture", fail_replay=failing == "replay", lower=make_lower)
    r.mode = "full"
    for _ in range(8):
        _step(r, (8, 64, 64, 3))
    assert len(lowers) == 1 and r.lower is lowers[0] and r.handed_over == 1 and not r.graphs
    downs = [e for e in r.log if e.action in ("step_down", "fallback")]
    assert len(downs) == 1 and downs[0].action == "step_down" and downs[0].mode == "network"
    assert downs[0].reason.startswith(f"{failing} failed (RuntimeError") and "cuda_graph=true" in downs[0].reason
    ev.validate_event(downs[0].to_dict())
    # the failing step itself and every later one ran on the level below, which counts shapes and captures anew
    assert len(r.ran) == 2 and len(lowers[0].ran) == 6
    assert [k for k, _ in lowers[0].ran][-2:] == ["graph", "graph"] and r.captures == lowers[0].captures + (
        failing == "replay"
    )
    # the trainer's passthroughs reach the level below
    r.skipped = "epoch's count read"
    assert lowers[0].eager.skipped == "epoch's count read" and r.eager.skipped is None
    r.invalidate("L1 on")
    assert [e.action for e in lowers[0].log][-1] == "invalidate" and r.lower is lowers[0]


def test_invalidate_drops_graphs_and_recaptures_once_stable():
    r = _FakeRunner()
    for _ in range(3):
        _step(r, (8, 64, 64, 3))
    r.invalidate("mosaic closed: the head computes something else")
    for _ in range(3):
        _step(r, (8, 64, 64, 3))
    assert [e.action for e in r.log] == ["capture", "invalidate", "recapture"]
    assert r.log[-1].reason.startswith("re-captured: mosaic closed: the head computes something else; captured")
    assert [k for k, _ in r.ran] == ["eager", "eager", "graph", "eager", "eager", "graph"]


@pytest.mark.parametrize("name", ["SGD", "AdamW"])
def test_capturable_update_matches_torch_optim(name):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, bias=False), torch.nn.BatchNorm2d(8), torch.nn.Conv2d(8, 4, 1))
    net2 = copy.deepcopy(net)
    o1 = optim.build_optimizer(net, name, 0.01, 0.9, 5e-4, CPU)
    o2 = optim.build_optimizer(net2, name, 0.01, 0.9, 5e-4, CPU)
    flat = FlatParams(net2, None)
    upd = CapturableUpdate(o2, name, torch.amp.GradScaler("cuda", enabled=False), None, 1.0, flat, CPU)
    for it in range(6):
        x = torch.randn(2, 3, 8, 8)
        for o in (o1, o2):  # a schedule that moves LR and momentum every step, as warm-up does
            for j, g in enumerate(o.param_groups):
                g["lr"] = 0.01 * (j + 1) * (1 + 0.1 * it)
                if "momentum" in g:
                    g["momentum"] = 0.8 + 0.02 * it
                else:
                    g["betas"] = (0.8 + 0.02 * it, g["betas"][1])
        net(x).pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        o1.step()
        o1.zero_grad()
        flat.forward(x).pow(2).mean().backward()
        flat.gather_grads()
        upd.load_hyper()
        upd.step()
    for a, b in zip(net.parameters(), net2.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # Adam divides by ~sqrt(v): rounding, not math
    state = upd.train_counters().optimizer
    if name == "AdamW":
        assert all(float(st["step"]) == 6.0 for st in state["state"].values())
        assert float(o2.state[next(net2.parameters())].get("step", 0.0)) == 0.0  # the optimizer's own state: untouched


@pytest.mark.parametrize("name", ["SGD", "AdamW"])
def test_a_step_down_hands_the_update_back_to_torch_optim_and_the_ema(name):
    """Three updates through the whole step's CapturableUpdate, a step-down (hand_back), three through torch's
    optimizer as the network graph's eager update runs them: the same weights, EMA and AdamW steps as six torch
    updates."""
    from libreyolo.engine.ema import ModelEMA

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, bias=False), torch.nn.BatchNorm2d(8), torch.nn.Conv2d(8, 4, 1))
    net2 = copy.deepcopy(net)
    o1 = optim.build_optimizer(net, name, 0.01, 0.9, 5e-4, CPU)
    o2 = optim.build_optimizer(net2, name, 0.01, 0.9, 5e-4, CPU)
    e1, e2 = ModelEMA(net, 0.9, 2.0), ModelEMA(net2, 0.9, 2.0)
    flat = FlatParams(net2, None)
    upd = CapturableUpdate(o2, name, torch.amp.GradScaler("cuda", enabled=False), e2, 0.0, flat, CPU)
    eager = SimpleNamespace(skipped=None)
    for it in range(6):
        x = torch.randn(2, 3, 8, 8)
        net(x).pow(2).mean().backward()
        o1.step()
        o1.zero_grad()
        e1.update()
        flat.forward(x).pow(2).mean().backward()
        flat.gather_grads()
        if it < 3:
            upd.load_hyper()
            upd.step()
            continue
        if it == 3:
            upd.hand_back(eager)
        o2.step()
        flat.zero_grad()
        flat.refresh()
        e2.update()
    for a, b in zip([*net.parameters(), *e1.ema.parameters()], [*net2.parameters(), *e2.ema.parameters()]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert e2.updates == 6 and eager.skipped is not None and int(eager.skipped) == 0
    if name == "AdamW":
        assert all(float(o2.state[p]["step"]) == 6.0 for p in net2.parameters())


@pytest.mark.parametrize("name", ["SGD", "AdamW"])
def test_capturable_update_resumed_from_a_checkpoint_continues_the_run(name, tmp_path):
    """Resume builds the update first and loads the checkpoint afterwards (as setup and Trainer.restore do):
    the LR the schedule sets must still reach the update, and the AdamW step and EMA counts must continue."""
    from libreyolo.engine.ema import ModelEMA

    def build(seed_net):
        net = copy.deepcopy(seed_net)
        opt = optim.build_optimizer(net, name, 0.01, 0.9, 5e-4, CPU)
        flat = FlatParams(net, None)
        ema = ModelEMA(net, 0.9999, 2.0)
        return (
            net,
            opt,
            ema,
            CapturableUpdate(opt, name, torch.amp.GradScaler("cuda", enabled=False), ema, 1.0, flat, CPU),
            flat,
        )

    def run(upd, opt, flat, steps):
        for it in steps:
            for j, g in enumerate(opt.param_groups):  # the schedule moves the LR every step
                g["lr"] = 0.01 * (j + 1) * (1 + 0.5 * it)
            torch.manual_seed(100 + it)
            flat.forward(torch.randn(2, 3, 8, 8)).pow(2).mean().backward()
            flat.gather_grads()
            upd.load_hyper()
            upd.step()

    torch.manual_seed(0)
    seed_net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, bias=False), torch.nn.BatchNorm2d(8), torch.nn.Conv2d(8, 4, 1)
    )
    net_a, opt_a, ema_a, upd_a, flat_a = build(seed_net)
    run(upd_a, opt_a, flat_a, range(6))

    net_b, opt_b, ema_b, upd_b, flat_b = build(seed_net)
    run(upd_b, opt_b, flat_b, range(3))
    # last.pt as the trainer writes it (state.train_state, packed snapshot, atomic write) and resume reads it back:
    # the AdamW steps and the EMA count go in as the update's device counters, never read on the host
    counters = upd_b.train_counters()
    no_scaler = torch.amp.GradScaler("cuda", enabled=False)
    state = train_state(net_b, counters, name, no_scaler, ema_b, False, str(tmp_path), set())
    record = {"format": FORMAT, "model": ema_b.ema.state_dict(), "train": snapshot(state, packed=True)}
    save_atomic(snapshot(record).resolve(), tmp_path / "last.pt")
    ckpt = load_checkpoint(tmp_path / "last.pt")
    net_c, opt_c, ema_c, upd_c, flat_c = build(seed_net)  # the resumed process
    restore_train_state(ckpt, net_c, opt_c, no_scaler, ema_c)
    assert ema_c.updates == 3
    upd_c.reload()
    flat_c.refresh()
    run(upd_c, opt_c, flat_c, range(3, 6))
    for a, c in zip(net_a.parameters(), net_c.parameters()):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)
    for a, c in zip(ema_a.ema.parameters(), ema_c.ema.parameters()):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)


def test_flat_params_give_the_same_training_as_plain_parameters():
    """functional_call on stand-ins + flat gradient accumulation == ordinary autograd accumulation."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, bias=False), torch.nn.BatchNorm2d(8), torch.nn.SiLU(), torch.nn.Conv2d(8, 4, 1)
    )
    ref = copy.deepcopy(net)
    flat = FlatParams(net, None)
    assert net[0].weight.grad is not None and net[0].weight.data_ptr() == flat.flat.data_ptr()
    for _ in range(3):  # accumulate three micro-batches
        x = torch.randn(2, 3, 8, 8)
        flat.forward(x).pow(2).mean().backward()
        flat.gather_grads()
        ref(x).pow(2).mean().backward()
    for a, b in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(net[1].running_mean, ref[1].running_mean)
    flat.zero_grad()
    assert float(flat.flat_grad.abs().sum()) == 0.0 and net[0].weight.grad is not None


@pytest.mark.parametrize("name", ["SGD", "AdamW"])
def test_non_finite_gradients_skip_the_step_on_the_device(name):
    """fp16 loss scaling: an inf gradient must leave weights, optimizer state and step count untouched
    (as GradScaler.step skips the optimizer), count the skip, and back off the scale."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, bias=False), torch.nn.BatchNorm2d(4))
    opt = optim.build_optimizer(net, name, 0.01, 0.9, 5e-4, CPU)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    flat = FlatParams(net, None)
    upd = CapturableUpdate(opt, name, scaler, None, 10.0, flat, CPU)
    before = [p.detach().clone() for p in net.parameters()]
    (flat.forward(torch.randn(2, 3, 8, 8)).sum() * scaler._scale).backward()
    flat.gather_grads()
    flat.flat_grad[0] = float("inf")
    upd.load_hyper()
    upd.step()
    for a, b in zip(before, net.parameters()):
        assert torch.equal(a, b)
    assert int(upd.skipped) == 1 and float(scaler._scale) == 512.0 and float(flat.flat_grad.abs().sum()) == 0.0
    (flat.forward(torch.randn(2, 3, 8, 8)).sum() * scaler._scale).backward()
    flat.gather_grads()
    upd.load_hyper()
    upd.step()
    assert all(torch.isfinite(p).all() for p in net.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters()))
    if name == "AdamW":
        assert all(float(st["step"]) == 1.0 for st in upd.train_counters().optimizer["state"].values())


@pytest.mark.parametrize(
    "epochs,no_aug,mosaic,start,expected",
    [
        (30, 15, 1.0, 0, 24),  # mosaic in epochs 0-14: four images' boxes, 7 + 5 + 3 + 2 = 17 -> 24
        (15, 15, 1.0, 0, 8),  # the default 15 no-mosaic epochs cover the whole run: one image's, 7 -> 8
        (30, 15, 1.0, 20, 8),  # resumed after mosaic closed
        (30, 15, 0.0, 0, 8),  # mosaic off
    ],
)
def test_the_whole_step_capacity_is_known_from_the_labels_before_the_first_capture(
    epochs, no_aug, mosaic, start, expected
):
    import numpy as np

    from libreyolo.engine.passes import target_capacity

    labels = [np.zeros((n, 5), np.float32) for n in (1, 5, 3, 0, 7, 2)]
    cfg = TrainConfig.from_overrides({"epochs": epochs, "no_aug_epochs": no_aug, "mosaic": mosaic})
    assert target_capacity(cfg, labels, start) == expected


def test_ddp_capacity_bound_covers_every_mosaic_batch(tiny_data):
    """Under DDP the whole-step graph's target capacity is fixed up front (every rank must replay the same graphs):
    four images' boxes for a mosaic, one image's without, and no real mosaic batch needs more."""
    import numpy as np

    from libreyolo.data.config import list_images, load_data_config
    from libreyolo.data.dataset import AugmentConfig, YOLODataset, capacity_bound, collate
    from libreyolo.data.labels import scan_labels

    labels = [np.zeros((n, 5), np.float32) for n in (1, 5, 3, 0, 7, 2)]
    assert capacity_bound(labels, mosaic=1.0) == 24  # 7 + 5 + 3 + 2 = 17 -> the next multiple of 8
    assert capacity_bound(labels, mosaic=0.0) == 8
    assert capacity_bound([], mosaic=1.0) == 4
    data = load_data_config(str(tiny_data))
    ls = scan_labels(list_images(data.train), data.nc)
    ds = YOLODataset(ls, 64, augment=True, hyp=AugmentConfig.from_config(TrainConfig.from_overrides({})), seed=0)
    bound = capacity_bound(ls.labels, 1.0)
    widest = collate([ds[(i, 0, True)] for i in range(len(ds))])["targets"].shape[1]
    assert 0 < widest <= bound


def test_full_for_a_network_only_plan_falls_back_to_the_network_graph_with_one_event():
    fam = _Fam()
    fam.capture = CapturePlan(("",), full_step=False, why_not_full="its matching runs on the host")
    seen = []
    runner, used, why = select_step(
        object(), None, TrainConfig.from_overrides({"cuda_graph": "full"}), fam, CUDA, 1, seen.append
    )
    assert used is True and type(runner).__name__ == "NetworkGraphStep"
    assert why == "cuda_graph=full: its matching runs on the host; the network in a graph instead (cuda_graph=true)"
    assert [(e.action, e.mode, e.reason) for e in seen] == [("fallback", "full", why)]
