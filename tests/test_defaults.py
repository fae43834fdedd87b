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


def test_building_saving_and_loading_an_optimizer_does_not_import_dynamo():
    """torch.optim's wrappers import torch._dynamo (seconds) on first use; the whole-step graph path calls only
    these methods, so a run in that mode starts without it. The state still round-trips."""
    import subprocess
    import sys

    code = """
import sys, torch
from libreyolo.engine import optim
net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
for name in ("SGD", "AdamW"):
    opt = optim.build_optimizer(net, name, 0.01, 0.9, 5e-4, torch.device("cpu"))
    opt.zero_grad()
    state = opt.state_dict()
    opt.load_state_dict(state)
    assert len(opt.state_dict()["param_groups"]) == 3
print("dynamo" if "torch._dynamo" in sys.modules else "no dynamo")
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=300).stdout
    assert out.split("\n")[-2] == "no dynamo", out
