"""The family contract, proved by a family that lives only in this file: two loss terms with names of its own,
one key of its own, its own parameter groups and schedule. It trains, validates, writes events and results.csv
with its term names, and the console's state shows them, with no edit anywhere outside this file."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import FAST
from torch import nn

from libreyolo import LibreYOLO
from libreyolo import keys as K
from libreyolo.config import TrainConfig
from libreyolo.errors import ConfigError
from libreyolo.events import read_events, validate_event
from libreyolo.families import NO_CAPTURE, Family, register, unregister
from libreyolo.families.base import FamilyImpl
from libreyolo.nn.blocks import Conv
from libreyolo.nn.head import Detect
from libreyolo.nn.nms import nms_packed


class ToyNet(nn.Module):
    strides = (8, 16, 32)

    def __init__(self, nc: int):
        super().__init__()
        self.nc = nc
        self.s8 = nn.Sequential(Conv(3, 8, 3, 2), Conv(8, 8, 3, 2), Conv(8, 16, 3, 2))
        self.s16, self.s32 = Conv(16, 16, 3, 2), Conv(16, 16, 3, 2)
        self.head = Detect(nc, (16, 16, 16), self.strides, reg_max=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.s8(x)
        b = self.s16(a)
        return self.head([a, b, self.s32(b)])[0]


class ToyLoss:
    """alpha: class BCE against 'an object's class at the cell holding its centre'; beta: a small box-logit
    penalty. Static shapes, no host synchronisation."""

    def __init__(self, net: ToyNet, cfg: Any):
        self.nc, self.gain = net.nc, float(TOY.options_of(cfg).toy_gain)

    def __call__(
        self, raw: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, imgsz: tuple[int, int], batch_scale: float
    ):
        logits = raw[:, 16:, :]  # (B, nc, A); the first 4 * reg_max rows are box logits
        h, w = imgsz[0] // 8, imgsz[1] // 8
        cx = ((targets[..., 1] + targets[..., 3]) / 16).long().clamp(0, w - 1)
        cy = ((targets[..., 2] + targets[..., 4]) / 16).long().clamp(0, h - 1)
        cell = cx + cy * w + targets[..., 0].long() * raw.shape[2]  # (B, M): class row, stride-8 cell
        t = torch.zeros_like(logits).flatten(1).scatter_(1, cell, mask.float()).view_as(logits)
        alpha = F.binary_cross_entropy_with_logits(logits, t)
        beta = raw[:, :16, :].pow(2).mean() * 1e-3
        items = torch.stack((alpha, beta))
        return (self.gain * alpha + beta) * batch_scale, items.detach()


def _postprocess(
    net: ToyNet,
    raw: torch.Tensor,
    imgsz: tuple[int, int],
    conf: float,
    iou: float,
    max_det: int,
    multi_label: bool = False,
) -> torch.Tensor:
    pred = net.head.decode(raw.float(), [(imgsz[0] // s, imgsz[1] // s) for s in net.strides])
    return nms_packed(pred[..., :4], pred[..., 4:], conf, iou, max_det, multi_label)


def _groups(net: nn.Module) -> list[dict[str, Any]]:
    """Two groups instead of the engine's three: results.csv then has lr/pg0 and lr/pg1 only."""
    decay = [p for n, p in net.named_parameters() if p.dim() > 1]
    rest = [p for n, p in net.named_parameters() if p.dim() <= 1]
    return [{"params": decay, "decay": True}, {"params": rest, "decay": False}]


SCHEDULED: list[int] = []


def _schedule(
    opt: torch.optim.Optimizer, cfg: Any, epoch: int, ni: int, warmup_iters: int, momentum: float, steps_per_epoch: int
) -> None:
    SCHEDULED.append(ni)
    for g in opt.param_groups:
        g["lr"] = g["initial_lr"] * (0.5 if epoch else 1.0)


@dataclass(frozen=True)
class ToyKeys:
    toy_gain: float = K.option(1.0, K.nonneg(K.number), "weight of the alpha term")


TOY = Family(
    name="toy",
    prefix="ToyNet",
    sizes=("a",),
    task="detect",
    loss_terms=("alpha", "beta"),
    impl=FamilyImpl(
        build=lambda size, nc: ToyNet(nc),
        train_net=lambda net, cfg: net,
        loss=lambda net, cfg, reduce=None: ToyLoss(net, cfg),
        postprocess=_postprocess,
        param_groups=_groups,
        schedule=_schedule,
    ),
    options=ToyKeys,
    capture=NO_CAPTURE,
    defaults={"optimizer": "AdamW", "lr0": 0.002},
)


@pytest.fixture
def toy():
    register(TOY)
    SCHEDULED.clear()
    yield TOY
    unregister("toy")


def test_a_family_from_outside_trains_validates_and_reports_its_own_terms(toy, tiny_data, tmp_path):
    m = LibreYOLO("ToyNeta")
    m.train(**{**FAST, "data": str(tiny_data), "project": str(tmp_path), "epochs": 2, "toy_gain": 2.0})
    run = m.last_run
    events = list(read_events(run / "events.jsonl"))
    for e in events:
        validate_event(e)
    start = events[0]
    assert start["type"] == "run_start" and start["family"] == "toy" and start["loss_terms"] == ["alpha", "beta"]
    assert start["config"]["toy_gain"] == 2.0 and "box" not in start["config"]
    assert (
        start["cuda_graph"] == "auto"
        and start["cuda_graph_mode"] == "false"
        and "eager on cpu" in start["cuda_graph_reason"]
    )
    for kind in ("epoch_end", "val"):
        got = [e for e in events if e["type"] == kind]
        assert len(got) == 2 and all(list(e["losses"]) == ["alpha", "beta"] for e in got)
    steps = [e for e in events if e["type"] == "step" and e["losses"]]
    assert steps and all(list(e["losses"]) == ["alpha", "beta"] for e in steps)
    assert events[-1]["type"] == "run_end" and events[-1]["status"] == "finished"
    with open(run / "results.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == [
        "epoch",
        "time",
        "train/alpha_loss",
        "train/beta_loss",
        "metrics/precision(B)",
        "metrics/recall(B)",
        "metrics/mAP50(B)",
        "metrics/mAP50-95(B)",
        "val/alpha_loss",
        "val/beta_loss",
        "lr/pg0",
        "lr/pg1",
    ]
    assert len(rows) == 3 and float(rows[2][2]) > 0
    # the family's schedule drove the LR: every step of both epochs, and the halving in epoch 2
    assert len(SCHEDULED) == 2 * start["steps_per_epoch"] and float(rows[2][-1]) == pytest.approx(0.001)
    assert "toy_gain: 2.0" in (run / "args.yaml").read_text()
    # the console folds the same file into the family's terms: rows, curves and table columns
    from libreyolo_console.state import RunState
    from libreyolo_console.widgets.epochs import columns

    state = RunState()
    state.apply(events)
    assert state.terms == ("alpha", "beta") and sorted(state.rows) == [0, 1]
    assert all(list(r.losses) == ["alpha", "beta"] for r in state.rows.values())
    assert state.losses and all(list(p[1]) == ["alpha", "beta"] for p in state.losses)
    assert columns(state.terms)[1:3] == ("alpha", "beta")


def test_family_keys_belong_to_their_family(toy):
    cfg = TrainConfig.from_overrides({"model": "ToyNeta", "toy_gain": 3})
    assert TOY.options_of(cfg).toy_gain == 3.0 and cfg.family == "toy" and cfg.to_dict()["toy_gain"] == 3.0
    with pytest.raises(
        ConfigError,
        match=r"dfl is a key of the yolo9 family \(LibreYOLO9t, LibreYOLO9s, LibreYOLO9m, LibreYOLO9c\); "
        r"toy models \(ToyNeta\) do not take it",
    ):
        TrainConfig.from_overrides({"model": "ToyNeta", "dfl": 1.0})
    with pytest.raises(
        ConfigError,
        match=r"box is a key of the yolo9 family \(LibreYOLO9t, LibreYOLO9s, LibreYOLO9m, LibreYOLO9c\), "
        r"the yolox family \(LibreYOLOXn",
    ):
        TrainConfig.from_overrides({"model": "ToyNeta", "box": 1.0})
    with pytest.raises(ConfigError, match=r"toy_gain is a key of the toy family \(ToyNeta\); yolo9 models"):
        TrainConfig.from_overrides({"model": "LibreYOLO9t", "toy_gain": 1.0})
    with pytest.raises(ConfigError, match=r"toy_gain='much' is not valid: toy_gain takes a number"):
        TrainConfig.from_overrides({"model": "ToyNeta", "toy_gain": "much"})
    spec = {k: (d, grp) for k, d, _, grp in TrainConfig.spec(toy)}
    assert spec["toy_gain"] == (1.0, "family:toy") and "box" not in spec and spec["optimizer"][0] == "AdamW"
    everyone = [k for k, *_ in TrainConfig.spec()]
    assert "toy_gain" in everyone and "box" in everyone


def test_built_in_families_keep_their_order_whatever_is_imported_first():
    """--help and the docs list families in the registry's order: importing a family's module first must not
    move it ahead (the registry is filled while that module is still being imported)."""
    import subprocess
    import sys

    firsts = (
        "libreyolo.families.rtdetr.network",
        "libreyolo.families.yolox.network",
        "libreyolo.families.classify",
        "libreyolo.config",
    )
    listed = "from libreyolo.families import families\nprint(','.join(families()))"
    baseline = subprocess.run([sys.executable, "-c", listed], check=True, capture_output=True, text=True, timeout=300)
    # a new built-in family joins the list by its order; these keep theirs
    order = baseline.stdout.split()[-1]
    assert order.startswith("yolo9,yolox,rtdetr,") and order.index("resnet") < order.index("mnv4"), order
    for first in firsts:
        code = f"import {first}\nfrom libreyolo.families import families\nprint(','.join(families()))"
        out = subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=300
        ).stdout
        assert out.split()[-1] == order, (first, out)
