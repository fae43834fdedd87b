"""The layer prewarm (engine/prewarm.py): every new convolution and BatchNorm input shape of a forward runs once,
forward and backward, in a helper thread; nothing random is drawn and the watched net computes as before."""

import torch
from torch import nn

from libreyolo.engine.prewarm import LayerPrewarm
from libreyolo.families import parse_model_name

CPU = torch.device("cpu")


class Twice(nn.Module):
    """One convolution called on two input sizes, one BatchNorm on both, and a layer the prewarm leaves alone."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=True)
        self.bn = nn.BatchNorm2d(4)
        self.skip = nn.Conv2d(4, 4, 1, padding_mode="reflect")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.bn(self.conv(x))
        b = self.bn(self.conv(x[:, :, ::2, ::2]))
        return self.skip(a).sum() + b.sum()


def test_each_new_shape_runs_once_and_the_helper_ends():
    net = Twice()
    pre = LayerPrewarm(CPU, torch.float32, channels_last=False)
    hooks = pre.watch(net)
    assert len(hooks) == 2  # the reflect-padded convolution is not watched
    x = torch.rand(2, 3, 8, 8)
    net(x)
    net(x)  # the same shapes again: nothing new
    for h in hooks:
        h.remove()
    pre.finish()
    assert pre.shapes == 4  # conv at 8 and 4 px, BatchNorm at 8 and 4 px
    assert pre.error is None
    assert not pre._thread.is_alive()


def test_the_prewarm_draws_nothing_random_and_leaves_the_forward_and_gradients_as_they_were():
    family, size = parse_model_name("LibreYOLO9t")
    net = family.build(size, 3).train()
    x = torch.rand(1, 3, 64, 64)

    def run(prewarm: bool) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        torch.manual_seed(0)
        m = family.build(size, 3).train()
        m.load_state_dict(net.state_dict())
        pre = LayerPrewarm(CPU, torch.float32, channels_last=False) if prewarm else None
        hooks = pre.watch(m) if pre is not None else []
        out = m(x)
        for h in hooks:
            h.remove()
        if pre is not None:
            pre.finish()
            assert pre.error is None and pre.shapes > 20
        flat = torch.cat([t.flatten() for t in (out if isinstance(out, (list, tuple)) else [out])])
        flat.float().square().mean().backward()
        grads = [p.grad.clone() for p in m.parameters() if p.grad is not None]
        return flat.detach(), torch.rand(4), grads

    plain_out, plain_rng, plain_grads = run(False)
    out, rng, grads = run(True)
    assert torch.equal(out, plain_out)
    assert torch.equal(rng, plain_rng)  # the generator is where it would be without the prewarm
    assert len(grads) == len(plain_grads) and all(torch.equal(a, b) for a, b in zip(grads, plain_grads, strict=True))


def test_a_failing_shape_is_recorded_and_the_rest_are_skipped():
    pre = LayerPrewarm(CPU, torch.float32, channels_last=False)
    conv = nn.Conv2d(3, 4, 3)
    hooks = pre.watch(conv)
    # a weight whose channels do not match the input: the helper's convolution raises, the hook does not
    conv.weight = nn.Parameter(torch.zeros(4, 5, 3, 3))
    try:
        conv(torch.rand(1, 3, 8, 8))
    except RuntimeError:
        pass
    for h in hooks:
        h.remove()
    pre.finish()
    assert isinstance(pre.error, RuntimeError)
