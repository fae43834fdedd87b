"""nn/blocks.Conv computes conv -> BatchNorm -> SiLU as functions when nothing observes its submodules: the same
numbers as calling the three modules, and the module path whenever something would notice the difference."""

import copy

import pytest
import torch
from torch import nn

from libreyolo.nn.blocks import Conv


def _modules_path(c: Conv, x: torch.Tensor) -> torch.Tensor:
    return c.act(c.bn(c.conv(x)))


@pytest.mark.parametrize("act", [True, False])
@pytest.mark.parametrize("amp", [False, True])
@pytest.mark.parametrize("train", [True, False])
def test_inline_conv_equals_the_module_calls_bit_for_bit(act, amp, train, monkeypatch):
    torch.manual_seed(0)
    a = Conv(4, 6, 3, 2, act=act).train(train)
    with torch.no_grad():
        a.bn.running_mean.uniform_(-1, 1)
        a.bn.running_var.uniform_(0.5, 2)
        a.bn.weight.uniform_(0.5, 2)
        a.bn.bias.uniform_(-1, 1)
    b = copy.deepcopy(a)
    x = torch.randn(2, 4, 9, 9, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        yb = _modules_path(b, x2)
        with monkeypatch.context() as mp:  # the inline path calls none of the submodules
            for cls in (nn.Conv2d, nn.BatchNorm2d, nn.SiLU, nn.Identity):
                mp.setattr(cls, "forward", lambda *_: pytest.fail("a submodule was called"))
            ya = a(x)
    assert ya.dtype == yb.dtype and torch.equal(ya, yb)
    ya.float().square().sum().backward()
    yb.float().square().sum().backward()
    assert torch.equal(x.grad, x2.grad)
    for (k, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p.grad, q.grad), k
    for (k, u), v in zip(a.named_buffers(), b.buffers()):
        assert torch.equal(u, v), k  # running statistics moved the same (or not at all, in eval mode)


def test_hooks_and_other_batchnorms_take_the_module_path():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8, 8)
    c = Conv(4, 4, 1)
    seen = []
    h = c.bn.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    c(x)
    h.remove()
    assert seen == [torch.Size([2, 4, 8, 8])]
    h = nn.modules.module.register_module_forward_pre_hook(lambda m, i: seen.append(type(m).__name__))
    c(x)
    h.remove()
    assert seen[1:] == ["Conv", "Conv2d", "BatchNorm2d", "SiLU"]
    c.conv.forward = lambda t: torch.zeros(2, 4, 8, 8)  # a patched forward (subgraphs.py replays graphs this way)
    with torch.no_grad():
        assert torch.equal(c.eval()(x), nn.SiLU()(c.bn(torch.zeros(2, 4, 8, 8))))
    del c.conv.forward

    class MyBN(nn.BatchNorm2d):  # a subclass (SyncBatchNorm under DDP is another class altogether)
        def forward(self, t):
            seen.append("MyBN")
            return super().forward(t)

    c.bn = MyBN(4)
    c(x)
    assert seen[-1] == "MyBN"


def test_one_value_per_channel_still_raises_batchnorms_error():
    c = Conv(3, 4, 1).train()
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        c(torch.randn(1, 3, 1, 1))
