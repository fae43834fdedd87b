"""The eager step's host-side shortcuts compute what the plain PyTorch code computes (CPU, float32)."""

import copy

import pytest
import torch
from torch import nn

from libreyolo.engine import optim
from libreyolo.engine.flat import FlatParams


class _Tied(nn.Module):
    """A shared submodule and a tied parameter: the cases functional_call unties."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.SiLU())
        self.b = self.a  # the same module under two names
        self.head = nn.Conv2d(8, 8, 1)
        self.tail = nn.Conv2d(8, 8, 1)
        self.tail.weight = self.head.weight  # one Parameter, two names

    def forward(self, x):
        return self.tail(self.head(self.b(x)))


@pytest.mark.parametrize("half", [None, torch.bfloat16])
def test_flat_forward_matches_functional_call_and_restores_the_parameters(half):
    torch.manual_seed(0)
    net = _Tied()
    ref = copy.deepcopy(net)
    flat = FlatParams(net, half)
    ref_flat = FlatParams(ref, half)
    before = {id(d): dict(d) for d in (m._parameters for m in net.modules())}
    x = torch.randn(2, 3, 12, 12)
    with torch.autocast("cpu", dtype=half or torch.float32, enabled=half is not None):
        out = flat.forward(x)
        want = torch.func.functional_call(ref_flat.module, ref_flat.proxies, (x,))
    assert torch.equal(out, want)
    out.square().mean().backward()
    want.square().mean().backward()
    for n in flat.names:
        assert torch.equal(flat.proxies[n].grad, ref_flat.proxies[n].grad), n
    for m in net.modules():  # the registered parameters are back, the same objects
        assert all(v is before[id(m._parameters)][k] for k, v in m._parameters.items())
    torch.testing.assert_close(net.a[1].running_mean, ref.a[1].running_mean, rtol=0, atol=0)


def test_flat_forward_restores_the_parameters_when_the_forward_raises():
    net = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4))
    params = [p for p in net.parameters()]
    flat = FlatParams(net, None)
    with pytest.raises(RuntimeError):
        flat.forward(torch.randn(2, 5, 8, 8))  # wrong channel count
    assert list(net.parameters()) == params and all(isinstance(p, nn.Parameter) for p in net.parameters())


@pytest.mark.parametrize("half,channels_last", [(None, False), (torch.bfloat16, False), (torch.bfloat16, True)])
def test_gathered_gradients_are_the_stand_ins_gradients_summed_in_float32(half, channels_last):
    """Half stand-ins (channels-last views with alignment gaps included) and fp32 aliases, over three micro-batches:
    each master's .grad is exactly the float32 sum of its stand-in's gradients, and the gaps stay zero."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 5, 3, bias=False), nn.BatchNorm2d(5), nn.SiLU(), nn.Conv2d(5, 7, 1), nn.Conv2d(7, 3, 3, padding=1)
    )
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    flat = FlatParams(net, half, channels_last)
    want = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in zip(flat.names, flat.params)}
    for _ in range(3):
        x = torch.randn(2, 3, 9, 9)
        with torch.autocast("cpu", dtype=half or torch.float32, enabled=half is not None):
            flat.forward(x).float().square().mean().backward()
        for n in flat.names:
            want[n] += flat.proxies[n].grad.float()
        flat.gather_grads()
        assert all(flat.proxies[n].grad is None for n in flat.names)
    for n, p in zip(flat.names, flat.params):
        assert torch.equal(p.grad, want[n]), n
    assert sum(p.numel() for p in flat.params) < flat.flat_grad.numel()  # there are gaps, and they hold zeros
    assert float(flat.flat_grad.abs().sum()) == pytest.approx(
        sum(float(w.abs().sum()) for w in want.values()), rel=1e-6
    )


def _batch(seed, b=2, size=64, m=3):
    g = torch.Generator().manual_seed(seed)
    img = torch.randint(0, 256, (b, size, size, 3), dtype=torch.uint8, generator=g)
    xy = torch.rand(b, m, 2, generator=g) * size * 0.6
    wh = torch.rand(b, m, 2, generator=g) * size * 0.4 + 4
    targets = torch.cat((torch.randint(0, 3, (b, m, 1), generator=g).float(), xy, (xy + wh).clamp(max=size)), -1)
    mask = torch.ones(b, m, dtype=torch.bool)
    mask[0, -1] = False
    return img, targets, mask


class _Poisoned:
    """The loss, times inf on the micro-steps listed: their gradients are non-finite and the scaler skips the step."""

    def __init__(self, loss_fn, bad):
        self.loss_fn, self.bad, self.n = loss_fn, set(bad), 0

    def __call__(self, *args):
        loss, items = self.loss_fn(*args)
        self.n += 1
        return (loss * float("inf"), items) if self.n in self.bad else (loss, items)


@pytest.mark.parametrize("name", ["SGD", "AdamW"])
def test_eager_step_trains_as_the_plain_pytorch_loop(name):
    """EagerStep (flat stand-ins, the optimizer build_optimizer makes, flat clipping, the EMA) against the textbook
    loop on ordinary parameters: autograd accumulation, GradScaler.unscale_, clip_grad_norm_, torch.optim's
    single-tensor implementation, ModelEMA. A loss scaler runs (on the CPU) and the first optimizer step is skipped
    for inf gradients, as float16's first steps often are."""
    from libreyolo.config import TrainConfig
    from libreyolo.engine.components import build_step_parts
    from libreyolo.engine.ema import ModelEMA
    from libreyolo.families import get_family
    from libreyolo.nn.inputs import normalize

    torch.manual_seed(0)
    family = get_family("yolo9")
    cfg = TrainConfig.from_overrides({"model": "LibreYOLO9t", "optimizer": name, "device": "cpu", "nbs": 4, "batch": 2})
    net = family.build("t", 3)
    parts = build_step_parts(family, net, cfg, torch.device("cpu"), 2, 1000)
    ref = copy.deepcopy(parts.train_net)
    for p in ref.parameters():
        p.data, p.grad = p.data.clone(), None  # own storage, not the copied flat buffer
    groups = [
        {"params": g["params"], "weight_decay": mine["weight_decay"]}
        for g, mine in zip(optim.param_groups(ref), parts.optimizer.param_groups)
    ]
    g0 = parts.optimizer.param_groups[0]
    if name == "SGD":
        ref_opt = torch.optim.SGD(groups, lr=g0["lr"], momentum=g0["momentum"], nesterov=True, foreach=False)
    else:
        ref_opt = torch.optim.AdamW(groups, lr=g0["lr"], betas=g0["betas"], eps=g0["eps"], foreach=False)
    ref_ema = ModelEMA(ref.net, parts.ema.decay, 3.0)
    parts.ema.tau = 3.0
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2) for _ in range(2)]
    loss_fn = _Poisoned(parts.loss_fn, bad=[2])  # the second micro-step of the first window
    step = type(parts.eager_step(10.0))(
        parts.train_net,
        loss_fn,
        parts.optimizer,
        scalers[0],
        parts.ema,
        None,
        10.0,
        parts.batch_scale,
        False,
        parts.flat,
    )
    ref_loss = _Poisoned(parts.loss_fn, bad=[2])
    acc = parts.accumulate
    assert acc == 2
    tol = dict(rtol=1e-5, atol=1e-6)
    for n in range(1, 9):
        img, targets, mask = _batch(n)
        items = step(img, targets, mask, n % acc == 0)
        loss, ref_items = ref_loss(ref(normalize(img)), targets, mask, (64, 64), parts.batch_scale)
        scalers[1].scale(loss).backward()
        torch.testing.assert_close(items, ref_items, **tol, msg=lambda m, n=n: f"step {n}: {m}")
        if n % acc:
            continue
        scalers[1].unscale_(ref_opt)
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 10.0)
        scalers[1].step(ref_opt)
        scalers[1].update()
        ref_opt.zero_grad()
        ref_ema.update()
        assert scalers[0].get_scale() == scalers[1].get_scale() and int(step.skipped) == 1
        mine = list(parts.train_net.parameters())
        for (k, a), b in zip(parts.train_net.named_parameters(), ref.parameters()):
            torch.testing.assert_close(a, b, **tol, msg=lambda m, n=n, k=k: f"step {n}, {k}: {m}")
        for a, b in zip(parts.train_net.buffers(), ref.buffers()):
            torch.testing.assert_close(a, b, **tol)
        for (k, a), b in zip(parts.ema.ema.state_dict().items(), ref_ema.ema.state_dict().values()):
            torch.testing.assert_close(a, b, **tol, msg=lambda m, n=n, k=k: f"step {n}, EMA {k}: {m}")
        # the loss's top-k anchor choice turns rounding differences into different gradients within a few
        # windows: each window starts the reference from this step's state, so that every window is compared
        with torch.no_grad():
            for a, b in zip(mine, ref.parameters()):
                b.copy_(a)
            for a, b in zip(parts.train_net.buffers(), ref.buffers()):
                b.copy_(a)
            for a, b in zip(mine, ref.parameters()):
                for key, t in parts.optimizer.state[a].items():
                    if key in ref_opt.state[b]:
                        ref_opt.state[b][key].copy_(t)
            for a, b in zip(parts.ema.ema.state_dict().values(), ref_ema.ema.state_dict().values()):
                b.copy_(a)


def test_half_stand_ins_compute_what_autocast_computes_on_the_parameters():
    """Convolution kernels and biases as half stand-ins (no per-step casts) against autocast casting fp32 parameters:
    the same outputs and, after gathering, the same fp32 gradients, bit for bit; autocast casts nothing in the
    forward."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 6, 3, bias=False), nn.BatchNorm2d(6), nn.SiLU(), nn.Conv2d(6, 5, 1), nn.Conv2d(5, 4, 3, padding=1)
    )
    ref = copy.deepcopy(net)
    flat = FlatParams(net, torch.bfloat16)
    assert flat.n_half_params == 5  # three kernels and two biases; BatchNorm's weight and bias stay float32
    x = torch.randn(2, 3, 10, 10)
    casts = []

    class _Casts(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default:
                casts.append(args[0].shape)
            return func(*args, **(kwargs or {}))

    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = ref(x)
        with _Casts():
            out = flat.forward(x)
    assert torch.equal(out, want)
    assert casts == [x.shape]  # only the float32 input, once
    want.float().square().mean().backward()
    out.float().square().mean().backward()
    flat.gather_grads()
    for (k, a), b in zip(net.named_parameters(), ref.parameters()):
        assert torch.equal(a.grad, b.grad), k
