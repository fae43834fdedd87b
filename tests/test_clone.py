"""nn/clone.clone returns what copy.deepcopy returns, for a network and for the module shapes deepcopy cares about."""

import copy

import torch
from torch import nn

from libreyolo import LibreYOLO
from libreyolo.nn.clone import clone


def _tensors(o):
    if isinstance(o, torch.Tensor):
        return [o]
    items = o.values() if isinstance(o, dict) else o
    return [t for v in items for t in _tensors(v)]


def test_a_network_clone_is_its_deepcopy():
    net = LibreYOLO("LibreYOLO9t").net.train()
    want, got = copy.deepcopy(net), clone(net)
    pairs = list(zip(want.named_modules(), got.named_modules(), strict=True))
    for (n1, m1), (n2, m2) in pairs:
        assert n1 == n2 and type(m1) is type(m2) and m1.__dict__.keys() == m2.__dict__.keys(), n1
        assert m1.training == m2.training
    sd1, sd2 = want.state_dict(), got.state_dict()
    assert list(sd1) == list(sd2) and all(torch.equal(sd1[k], sd2[k]) for k in sd1)
    for p, q, r in zip(net.parameters(), got.parameters(), want.parameters(), strict=True):
        assert q.requires_grad == r.requires_grad and type(q) is type(r)
        assert q.data_ptr() != p.data_ptr()  # its own storage
    x = torch.randn(2, 3, 64, 64)
    out1, out2 = want(x), got(x)  # train mode: BatchNorm statistics move in each copy alone
    assert all(torch.equal(a, b) for a, b in zip(_tensors(out1), _tensors(out2), strict=True))
    assert torch.equal(next(got.buffers()), next(want.buffers()))
    assert not torch.equal(next(got.buffers()), next(net.buffers()))  # the original's statistics did not move


class _Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)
        self.b.weight = self.a.weight  # tied
        self.a.cache = self.b.cache = {"k": torch.zeros(1)}  # one mutable object in two places
        self.a.seen = self.b.seen = []  # an empty one too
        self.a.register_forward_hook(_hook)


def _hook(module, args, out):
    return out + 1


class _OwnCopy(nn.Module):
    def __deepcopy__(self, memo):
        new = _OwnCopy()
        new.made_by = "__deepcopy__"
        return new


def test_clone_keeps_deepcopys_sharing_hooks_and_memo():
    m = _Pair()
    memo: dict = {}
    c = clone(m, memo)
    assert memo[id(m.a)] is c.a and memo[id(m)] is c
    assert c.a.weight is c.b.weight and c.a.weight is not m.a.weight
    assert c.a.cache is c.b.cache and c.a.cache is not m.a.cache
    assert c.a.seen is c.b.seen and c.a.seen is not m.a.seen
    assert torch.equal(c.a(torch.ones(1, 3)), m.a(torch.ones(1, 3)))  # the hook came along (+1 in both)
    assert list(c.a._forward_hooks.values()) == [_hook]


def test_a_module_that_copies_itself_keeps_its_own_way():
    holder = nn.Sequential(_OwnCopy())
    assert clone(holder)[0].made_by == "__deepcopy__"
