"""The plug-in contract, proved from outside: a package written into a temporary folder brings a toy family and a
toy task (its own metric, validation and predict output) through entry points, edits nothing of libreyolo, and
trains, validates, predicts and saves through the Python API and the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import libreyolo.families as families_registry
import libreyolo.tasks as tasks_registry
from libreyolo import LibreYOLO
from libreyolo.events import read_events

FAMILY_SPEC = """
from dataclasses import dataclass

from libreyolo import keys as K
from libreyolo.families import NO_CAPTURE, Family, register


@dataclass(frozen=True)
class ToyKeys:
    toy_gain: float = K.option(1.0, K.nonneg(K.number), "weight of the alpha term")


FAMILY = register(
    Family(
        name="plugtoy", prefix="PlugToy", sizes=("a",), task="count", loss_terms=("alpha", "beta"),
        impl="toyplug.family.impl", options=ToyKeys, capture=NO_CAPTURE, defaults={"optimizer": "AdamW", "lr0": 0.002},
    )
)
"""

FAMILY_IMPL = """
import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.families.base import FamilyImpl
from libreyolo.nn.blocks import Conv
from libreyolo.nn.head import Detect
from libreyolo.nn.nms import nms_packed
from toyplug.family import FAMILY


class ToyNet(nn.Module):
    strides = (8, 16, 32)

    def __init__(self, nc):
        super().__init__()
        self.nc = nc
        self.s8 = nn.Sequential(Conv(3, 8, 3, 2), Conv(8, 8, 3, 2), Conv(8, 16, 3, 2))
        self.s16, self.s32 = Conv(16, 16, 3, 2), Conv(16, 16, 3, 2)
        self.head = Detect(nc, (16, 16, 16), self.strides, reg_max=4)

    def forward(self, x):
        a = self.s8(x)
        b = self.s16(a)
        return self.head([a, b, self.s32(b)])[0]


class ToyLoss:
    def __init__(self, net, cfg):
        self.nc, self.gain = net.nc, float(FAMILY.options_of(cfg).toy_gain)

    def __call__(self, raw, targets, mask, imgsz, batch_scale):
        logits = raw[:, 16:, :]
        h, w = imgsz[0] // 8, imgsz[1] // 8
        cx = ((targets[..., 1] + targets[..., 3]) / 16).long().clamp(0, w - 1)
        cy = ((targets[..., 2] + targets[..., 4]) / 16).long().clamp(0, h - 1)
        cell = cx + cy * w + targets[..., 0].long() * raw.shape[2]
        t = torch.zeros_like(logits).flatten(1).scatter_(1, cell, mask.float()).view_as(logits)
        alpha = F.binary_cross_entropy_with_logits(logits, t)
        beta = raw[:, :16, :].pow(2).mean() * 1e-3
        return (self.gain * alpha + beta) * batch_scale, torch.stack((alpha, beta)).detach()


def postprocess(net, raw, imgsz, conf, iou, max_det, multi_label=False):
    pred = net.head.decode(raw.float(), [(imgsz[0] // s, imgsz[1] // s) for s in net.strides])
    return nms_packed(pred[..., :4], pred[..., 4:], conf, iou, max_det, multi_label)


IMPL = FamilyImpl(
    build=lambda size, nc: ToyNet(nc),
    train_net=lambda net, cfg: net,
    loss=lambda net, cfg, reduce=None: ToyLoss(net, cfg),
    postprocess=postprocess,
)
"""

TASK_SPEC = """
from libreyolo.tasks import Metric, Task, register

COUNT = register(
    Task("count", (Metric("count_acc", "count acc", "metrics/count_acc"),), {"count_acc": 1.0}, "count_acc",
         impl="toyplug.task.impl")
)
"""

# a toy task on detection's data: the fraction of images whose detected objects (conf 0.25) number as many as their
# labels; predict gives each image's count
TASK_IMPL = """
import time

import torch

from libreyolo.eval.validator import PendingValidation, to_input
from libreyolo.tasks import get_task
from libreyolo.tasks.base import TaskImpl

DETECT = get_task("detect").implementation()


@torch.no_grad()
def start_validation(net, family, loader, device, names, loss_fn=None, conf=0.001, iou=0.7, max_det=300,
                     autocast_dtype=None, channels_last=False, **kwargs):
    t0, was = time.perf_counter(), net.training
    net.eval()
    hits = images = 0
    losses = torch.zeros(len(family.loss_terms))
    for batch in loader:
        x = to_input(batch["img"], device, channels_last)
        raw = net(x)
        if loss_fn is not None:
            targets, mask = batch["targets"].to(device), batch["mask"].to(device)
            losses += loss_fn(raw, targets, mask, tuple(x.shape[2:]), 1.0)[1].cpu()
        packed = family.postprocess(net, raw, tuple(x.shape[2:]), 0.25, iou, max_det)
        found = torch.bincount(packed[:, 0].long().cpu(), minlength=x.shape[0])
        hits += int((found == batch["mask"].sum(1)).sum())
        images += x.shape[0]
    net.train(was)
    base = {"count_acc": hits / max(images, 1), "losses": dict(zip(family.loss_terms, losses.tolist())),
            "images": images, "time_s": time.perf_counter() - t0, "bad": []}
    return PendingValidation(None, base, background=False)


def predict(model, source, conf, iou, imgsz, device, max_det, multi_label, top_k):
    return [len(r) for r in DETECT.predict(model, source, conf, iou, imgsz, device, max_det, multi_label, top_k)]


IMPL = TaskImpl(load_data=DETECT.load_data, scan=DETECT.scan, dataset=DETECT.dataset,
                start_validation=start_validation, predict=predict)
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The package toyplug in a folder of its own, announced by entry points as an installed distribution would."""
    root = tmp_path / "plugins"
    files = {
        "toyplug/__init__.py": "",
        "toyplug/family/__init__.py": FAMILY_SPEC,
        "toyplug/family/impl.py": FAMILY_IMPL,
        "toyplug/task/__init__.py": TASK_SPEC,
        "toyplug/task/impl.py": TASK_IMPL,
        "toyplug-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: toyplug\nVersion: 0.1\n",
        "toyplug-0.1.dist-info/entry_points.txt": (
            "[libreyolo.families]\ntoy = toyplug.family\n\n[libreyolo.tasks]\ncount = toyplug.task\n"
        ),
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(root))
    # this process discovered its plug-ins before the package existed: look again
    monkeypatch.setattr(families_registry, "_discovered", False)
    monkeypatch.setattr(tasks_registry, "_plugins_loaded", False)
    yield root
    families_registry.unregister("plugtoy")
    tasks_registry.unregister("count")
    for mod in [m for m in sys.modules if m == "toyplug" or m.startswith("toyplug.")]:
        del sys.modules[mod]


def test_a_plugin_family_and_task_train_validate_predict_and_save_through_the_api(plugin, tiny_data, tmp_path):
    m = LibreYOLO("PlugToya")
    args = dict(imgsz=64, batch=8, workers=0, warmup_epochs=0, device="cpu", epochs=2, toy_gain=2.0)
    metrics = m.train(data=str(tiny_data), project=str(tmp_path / "runs"), **args)
    assert set(metrics) == {"count_acc", "fitness"} and 0.0 <= metrics["count_acc"] <= 1.0
    events = list(read_events(m.last_run / "events.jsonl"))
    start = events[0]
    assert (start["family"], start["task"], start["metrics"]) == ("plugtoy", "count", ["count_acc"])
    assert start["loss_terms"] == ["alpha", "beta"] and start["config"]["toy_gain"] == 2.0
    header = (m.last_run / "results.csv").read_text().splitlines()[0].split(",")
    assert [h.strip() for h in header][2:6] == [
        "train/alpha_loss",
        "train/beta_loss",
        "metrics/count_acc",
        "val/alpha_loss",
    ]
    assert events[-1]["status"] == "finished"
    val = m.val(str(tiny_data), imgsz=64, batch=8, workers=0, device="cpu")
    assert set(val["metrics"] if "metrics" in val else val) >= {"count_acc"}
    counts = m.predict(str(Path(tiny_data).parent / "images" / "val"), imgsz=64, device="cpu")
    assert len(counts) == 8 and all(isinstance(c, int) and c >= 0 for c in counts)
    saved = m.save(tmp_path / "toy.pt")
    again = LibreYOLO(saved)
    assert again.family.name == "plugtoy" and again.model_name == "PlugToya"


def test_a_plugin_trains_validates_and_predicts_through_the_cli(plugin, tiny_data, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")])}

    def cli(*argv: str) -> str:
        r = subprocess.run(
            [sys.executable, "-m", "libreyolo.cli.main", *argv], capture_output=True, text=True, env=env, timeout=600
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        return r.stdout + r.stderr

    keys = ["imgsz=64", "batch=8", "workers=0", "device=cpu", "warmup_epochs=0"]
    project = tmp_path / "runs"
    cli("train", "model=PlugToya", f"data={tiny_data}", "epochs=1", f"project={project}", "name=toy", *keys)
    best = project / "toy" / "weights" / "best.pt"
    assert best.is_file()
    out = cli("val", f"model={best}", f"data={tiny_data}", *keys[:4])
    assert "count acc" in out or "count_acc" in out
    assert "toy_gain" in cli("train", "--help")


def test_the_model_keys_help_names_a_plugins_models(plugin):
    """The `model` key's help (train --help, docs/hyperparameters.md, the console's form) is built from the
    registry: a plug-in's models are listed with no edit outside its package."""
    from libreyolo.config import TrainConfig

    helps = {key: help_ for key, _, help_, _ in TrainConfig.spec()}
    assert "PlugToya" in helps["model"] and "LibreYOLO9t/s/m/c" in helps["model"]
    assert "{models}" not in helps["model"]
