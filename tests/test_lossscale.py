"""The float16 start loss scale (engine/lossscale.py): read off the first batch, so the first optimizer steps
are not skipped while GradScaler backs off from 65,536. Runs on the CPU (GradScaler("cpu"), float16 math)."""

import pytest
import torch

from libreyolo.engine.lossscale import largest_finite_exp, probe_loss_scale, set_start_scale


class _Half(torch.nn.Module):
    """float32 master weights, float16 compute, a BatchNorm whose statistics the probe must not move; over a
    batch of 4 the loss gradient is 4,000 per weight, so a scale above 65504 / 4000 = 16.4 overflows float16."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64))
        self.bn = torch.nn.BatchNorm1d(64)

    def forward(self, x):
        return self.w.half() * self.bn(x).half().clamp(1000.0, 1000.0)


def _loss(out, targets, mask, imgsz, batch_scale):
    return out.float().sum() * batch_scale, torch.zeros(1)


def _probe(net, x):
    return probe_loss_scale(net, lambda img: net(x), _loss, [net.w], torch.zeros(1, 8, 8, 3), None, None, 1.0)


@pytest.mark.parametrize("limit", [0, 5, 13, 24])
def test_bisection_finds_the_largest_finite_exponent(limit):
    calls = []
    assert largest_finite_exp(lambda e: calls.append(e) or e <= limit) == limit
    assert len(calls) <= 6  # log2(25) + the check at 0


def test_probe_picks_one_halving_below_the_overflow_and_leaves_batchnorm_alone():
    torch.manual_seed(0)
    net = _Half().train()
    x = torch.randn(4, 64)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    scale, exp = _probe(net, x)
    assert exp == 4 and scale == 8.0  # 16 * 4000 < 65504 < 32 * 4000
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert net.w.grad is None  # nothing accumulated


def test_a_gradient_that_overflows_at_scale_one_starts_at_one():
    net = _Half()
    scale, exp = probe_loss_scale(
        net, lambda img: net(torch.randn(4, 64)) * 1e3, _loss, [net.w], torch.zeros(1, 8, 8, 3), None, None, 1.0
    )
    assert (scale, exp) == (1.0, None)


@pytest.mark.parametrize("probed,expected_skips", [(False, 12), (True, 0)])  # 65536 -> 16: 12 halvings
def test_skipped_steps_at_the_start_of_a_float16_run(probed, expected_skips):
    torch.manual_seed(0)
    net = _Half().train()
    x = torch.randn(4, 64)
    opt = torch.optim.SGD(net.parameters(), lr=1e-6)
    scaler = torch.amp.GradScaler("cpu", init_scale=65536.0)
    if probed:
        set_start_scale(scaler, _probe(net, x)[0])
    skipped = 0
    for _ in range(16):
        scaler.scale(_loss(net(x), None, None, None, 1.0)[0]).backward()
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped += scaler.get_scale() < before
        opt.zero_grad()
    assert skipped == expected_skips


@pytest.mark.parametrize("limit,guess,most_checks", [(13, 13, 3), (13, 12, 6), (13, 20, 7), (0, 5, 6), (24, 24, 2)])
def test_a_good_guess_decides_in_three_checks_and_a_bad_one_still_finds_the_limit(limit, guess, most_checks):
    calls = []
    assert largest_finite_exp(lambda e: calls.append(e) or e <= limit, guess=lambda: guess) == limit
    assert len(calls) <= most_checks, calls


class _Amplifier(torch.nn.Module):
    """float16 activations whose gradient (x 64 through the second layer) peaks far above the weight gradient:
    the overflow limit is set by an activation, which the optimizer never sees."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((64,), 0.01))
        self.inner = torch.nn.Identity()

    def forward(self, x):
        h = self.inner(self.w.half() * x.half())
        return h * 64.0


def test_activation_gradient_peaks_make_the_first_guess_exact(monkeypatch):
    net = _Amplifier()
    x = torch.full((4, 64), 0.01)
    passes = []
    real_grad = torch.autograd.grad
    monkeypatch.setattr(torch.autograd, "grad", lambda *a, **k: passes.append(1) or real_grad(*a, **k))
    scale, exp = probe_loss_scale(net, lambda img: net(x), _loss, [net.w], torch.zeros(1, 8, 8, 3), None, None, 1.0)
    # d loss / d h = 64 per element, d loss / d w = 64 * 0.01 * 4 = 2.56: the weight alone would say 2^14, the
    # activation limits it to 2^9 (64 * 2^10 = 65536 > 65504)
    assert exp == 9 and scale == 256.0
    assert len(passes) == 3  # scale 1, the guess, the guess + 1
