"""The eager step's host-side shortcuts compute what the plain PyTorch code computes (CPU, float32)."""

import copy

import pytest
import torch
from torch import nn

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
    net = nn.Sequential(nn.Conv2d(3, 5, 3, bias=False), nn.BatchNorm2d(5), nn.SiLU(), nn.Conv2d(5, 7, 1), nn.Conv2d(7, 3, 3, padding=1))
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
    assert float(flat.flat_grad.abs().sum()) == pytest.approx(sum(float(w.abs().sum()) for w in want.values()), rel=1e-6)
