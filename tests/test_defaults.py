"""The rules behind the defaults that depend on the run's length (docs/performance.md measures them)."""

import pytest

from libreyolo.config import TrainConfig
from libreyolo.engine import optim
from libreyolo.engine.components import NOMINAL_BATCH, optimizer_steps, resolve_nbs
from libreyolo.errors import ConfigError


@pytest.mark.parametrize(
    "nbs,batch,n,epochs,expected",
    [
        ("auto", 16, 800, 15, 16),  # a short run steps every batch
        ("auto", 64, 800, 15, 64),
        ("auto", 16, 118_000, 300, NOMINAL_BATCH),  # COCO-sized: accumulate to 64 as Ultralytics does
        ("auto", 128, 118_000, 300, NOMINAL_BATCH),  # (a step per batch all the same: accumulate rounds to 1)
        (64, 16, 800, 15, 64),  # explicit values keep their meaning
        (32, 16, 118_000, 300, 32),
    ],
)
def test_nbs_auto_accumulates_only_in_long_runs(nbs, batch, n, epochs, expected):
    assert resolve_nbs(nbs, batch, n, epochs) == expected


def test_the_long_run_line_is_the_one_optimizer_auto_uses():
    # 10,000 optimizer steps at the nominal batch: the same run is "long" for both rules
    n, batch = 64 * 100, 16  # 100 steps of 64 per epoch
    for epochs, long_run in ((100, False), (101, True)):
        steps = optimizer_steps(n, batch, NOMINAL_BATCH, epochs)
        cfg = TrainConfig.from_overrides({"epochs": epochs})
        assert (optim.resolve_optimizer(cfg, 4, steps)[0] == "SGD") is long_run
        assert (resolve_nbs("auto", batch, n, epochs) == NOMINAL_BATCH) is long_run


def test_nbs_takes_a_positive_integer_or_auto():
    assert (
        TrainConfig.from_overrides({"nbs": "auto"}).nbs == "auto"
        and TrainConfig.from_overrides({"nbs": "32"}).nbs == 32
    )
    with pytest.raises(ConfigError, match="nbs='-3' is not valid: nbs takes a positive integer or auto"):
        TrainConfig.from_overrides({"nbs": "-3"})


def test_building_stepping_saving_and_loading_an_optimizer_does_not_import_dynamo():
    """torch.optim's wrappers import torch._dynamo (seconds) on first use; a run's optimizer makes the same updates
    without it: each step equals torch's own step (taken afterwards, which loads dynamo) bit for bit."""
    import subprocess
    import sys

    code = """
import copy, sys, torch
from libreyolo.engine import optim
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
x = torch.randn(2, 3, 8, 8)
pairs = []
for name in ("SGD", "AdamW"):
    a, b, start = net, copy.deepcopy(net), copy.deepcopy(net)
    opt_a = optim.build_optimizer(a, name, 0.01, 0.9, 5e-4, torch.device("cpu"))
    opt_b = optim.build_optimizer(b, name, 0.01, 0.9, 5e-4, torch.device("cpu"))
    for _ in range(2):
        a(x).square().mean().backward()
        opt_a.step()
        opt_a.zero_grad()
    state = opt_a.state_dict()
    opt_a.load_state_dict(state)
    pairs.append((a, b, opt_b))
    assert not torch.equal(next(a.parameters()), next(start.parameters()))  # the steps did update
    net = copy.deepcopy(net)
print("dynamo" if "torch._dynamo" in sys.modules else "no dynamo")
for a, b, opt_b in pairs:
    for _ in range(2):
        b(x).square().mean().backward()
        type(opt_b).step(opt_b)  # torch's wrapped step
        opt_b.zero_grad()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
print("same updates")
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=300).stdout
    assert out.split("\n")[-3:-1] == ["no dynamo", "same updates"], out
