"""Weights files (libreyolo/weights): foreign formats found by content, safe loading, clear errors, torchvision
ResNet as a classifier, the official YOLOX layout, pretrained= with another class count, and freeze=."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from conftest import NO_AUG, repeated_shapes

from libreyolo import LibreYOLO
from libreyolo.errors import CheckpointError, ConfigError
from libreyolo.families import get_family
from libreyolo.weights import write
from libreyolo.weights.transfer import freeze


def _randomise_bn(net: torch.nn.Module) -> None:
    """Fresh BatchNorm is the identity: give it statistics, so that a wrong mapping of them shows."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)


def test_a_missing_weights_file_says_where_such_files_are_published(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError) as e:
        LibreYOLO("LibreYOLOXs.pt")
    msg = str(e.value)
    assert "LibreYOLOXs.pt does not exist" in msg and "nothing is downloaded" in msg
    assert "Megvii-BaseDetection/YOLOX" in msg and "pretrained=path" in msg and "model=LibreYOLOXs builds" in msg
    with pytest.raises(CheckpointError, match="yolox_s.pth does not exist"):
        LibreYOLO("yolox_s.pth")


def test_an_unknown_file_names_itself_and_the_known_formats(tmp_path):
    odd = tmp_path / "odd.pt"
    torch.save({"model": {"encoder.weight": torch.zeros(3)}}, odd)
    with pytest.raises(CheckpointError) as e:
        LibreYOLO(odd)
    msg = str(e.value)
    assert str(odd) in msg and "no known format" in msg
    for known in ("libreyolo.checkpoint/v1", "LibreYOLO 1.6 YOLOv9", "official layout", "torchvision ResNet"):
        assert known in msg
    text = tmp_path / "notes.pth"
    text.write_text("hello")
    with pytest.raises(
        CheckpointError, match="notes.pth is not a libreyolo checkpoint: it is not a PyTorch file.*Known formats"
    ):
        LibreYOLO(text)


class Trainer:
    """Stands for the objects a full checkpoint pickles (an Exp, an argparse.Namespace): loading it runs code."""


def test_a_file_that_would_run_code_is_refused(tmp_path):
    bad = tmp_path / "pickled.pt"
    torch.save({"model": {"w": torch.zeros(1)}, "exp": Trainer()}, bad)
    with pytest.raises(CheckpointError, match="would execute code stored in the file"):
        LibreYOLO(bad)


def test_a_torchvision_resnet_state_dict_is_a_classifier(tmp_path):
    from torchvision.models import resnet18

    ref = resnet18(weights=None, num_classes=5).eval()
    _randomise_bn(ref)
    torch.save(ref.state_dict(), tmp_path / "resnet18.pth")
    model = LibreYOLO(tmp_path / "resnet18.pth")
    assert model.model_name == "LibreResNet18" and model.nc == 5
    assert model.loaded_note.startswith(f"read {tmp_path / 'resnet18.pth'}: torchvision ResNet")
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model.net.eval()(x), ref(x), atol=1e-5, rtol=0)


def test_the_official_yolox_layout_reads_back_what_was_written(tmp_path):
    """Ours -> the official layout (BGR 0..255 stem, YOLOPAFPN names, in a .pth as the release saves it) -> ours:
    the same function of the same image. tests/test_weights16.py checks this layout against LibreYOLO 1.6."""
    fam = get_family("yolox")
    net = fam.build("t", 4).eval()
    _randomise_bn(net)
    official = write(fam, "t", net.state_dict(), "YOLOX weights in the official layout")
    assert "backbone.backbone.dark2.0.conv.weight" in official and "backbone.lateral_conv0.conv.weight" in official
    torch.save({"start_epoch": 300, "model": official}, tmp_path / "yolox_tiny.pth")
    model = LibreYOLO(tmp_path / "yolox_tiny.pth")
    assert model.model_name == "LibreYOLOXt" and "official layout" in model.loaded_note
    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model.net.eval()(x), net(x), atol=1e-4, rtol=0)


def test_pretrained_with_another_class_count_reinitialises_the_class_layers(tmp_path, capsys):
    src = LibreYOLO("LibreYOLOXn", nc=5)
    path = src.save(tmp_path / "five.pt")
    model = LibreYOLO("LibreYOLOXn", pretrained=path)
    model._start = (model.pretrained, 0)  # what train() sets from its keys
    net = model.prepare_for_training(["a", "b", "c"], fresh=True)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    n = len(net.state_dict())
    # the class convolutions' weight and bias, at each of the three levels
    assert line == (
        f"pretrained={path}: {n - 6} tensors loaded, 6 re-initialised, 0 ignored (re-initialised: "
        "head.cls_preds.0.weight, head.cls_preds.0.bias, head.cls_preds.1.weight and 3 more)"
    )
    theirs = src.net.state_dict()
    assert torch.equal(net.state_dict()["head.reg_preds.0.weight"], theirs["head.reg_preds.0.weight"])
    assert net.head.cls_preds[0].weight.shape[0] == 3


def test_pretrained_of_another_network_is_refused(tmp_path):
    path = LibreYOLO("LibreYOLOXn").save(tmp_path / "n.pt")
    model = LibreYOLO("LibreYOLO9t", pretrained=path)
    model._start = (model.pretrained, 0)
    with pytest.raises(ConfigError, match="holds weights of yolox n, not of LibreYOLO9t"):
        model.prepare_for_training(["a"], fresh=True)


def test_freeze_backbone_and_n():
    fam = get_family("yolo9")
    net = fam.build("t", 3)
    line = freeze(net, "backbone", fam.backbone)
    for name, p in net.named_parameters():
        assert p.requires_grad == (name.split(".")[0] not in ("stem", "b3", "b4", "b5")), name
    assert line.startswith("freeze=backbone: ") and "(stem, b3, b4, b5)" in line
    net = fam.build("t", 3)
    assert "(stem, b3)" in freeze(net, 2, fam.backbone)
    assert net.b4[1].cv1.conv.weight.requires_grad and not net.b3[1].cv1.conv.weight.requires_grad
    assert freeze(net, 0, fam.backbone) == ""
    with pytest.raises(ConfigError, match="freeze=99: backbone, or a count of top-level modules"):
        freeze(net, 99, fam.backbone)


def test_a_libreyolo16_checkpoint_fine_tunes_better_than_random_init(tmp_path):
    """The issue's check on CPU: a checkpoint made by a brief training, written in LibreYOLO 1.6's format (the
    fields 1.6's save() writes, its layout), trained again for 3 epochs from model=<file>: its first validation
    beats a randomly initialised run of the same length."""
    data = repeated_shapes(tmp_path / "shapes", size=96)
    args = dict(data=str(data), imgsz=96, batch=8, nbs=8, workers=0, device="cpu", warmup_epochs=0, seed=0, **NO_AUG)
    pre = LibreYOLO("LibreYOLOXn")
    pre.train(epochs=16, project=str(tmp_path / "runs"), name="pre", optimizer="AdamW", lr0=0.004, val=False, **args)
    state = write(pre.family, "n", pre.net.state_dict(), "LibreYOLO 1.6")
    names = {0: "circle", 1: "square", 2: "triangle"}
    record = {"model": state, "schema_version": "1.0", "libreyolo_version": "1.6.0", "model_family": "yolox"}
    record |= {"size": "n", "task": "detect", "nc": 3, "names": names, "imgsz": 96}
    torch.save(record, tmp_path / "LibreYOLOXn-1.6.pt")

    def first_val(source: str | Path, name: str) -> tuple[float, float]:
        """-> the first validation's mAP50 and loss (YOLOX's gains: 5 iou + obj + cls)."""
        model = LibreYOLO(source)
        model.train(epochs=3, project=str(tmp_path / "runs"), name=name, optimizer="AdamW", lr0=0.002, **args)
        row = next(csv.DictReader(open(model.last_run / "results.csv")))
        loss = 5 * float(row["val/iou_loss"]) + float(row["val/obj_loss"]) + float(row["val/cls_loss"])
        return float(row["metrics/mAP50(B)"]), loss

    tuned = first_val(tmp_path / "LibreYOLOXn-1.6.pt", "tuned")
    scratch = first_val("LibreYOLOXn", "scratch")
    assert tuned[0] > scratch[0] and tuned[1] < scratch[1], (tuned, scratch)


def test_a_frozen_backbone_keeps_its_pretrained_weights_through_training(tiny_data, tmp_path, capsys):
    src = LibreYOLO("LibreYOLOXn", nc=5)
    with torch.no_grad():
        for p in src.net.parameters():
            p.add_(0.01)  # not what a fresh build under the run's seed gives
    path = src.save(tmp_path / "start.pt")
    model = LibreYOLO("LibreYOLOXn")
    args = dict(data=str(tiny_data), imgsz=64, batch=8, workers=0, device="cpu", warmup_epochs=0, val=False)
    model.train(epochs=1, project=str(tmp_path), pretrained=str(path), freeze="backbone", **args)
    out = capsys.readouterr().out
    assert f"pretrained={path}: " in out and "freeze=backbone: " in out
    start, trained = src.net.state_dict(), model.net.state_dict()
    params = {n for n, _ in model.net.named_parameters()}
    moved = [k for k in params if not torch.equal(start[k], trained[k])]
    assert moved and all(not k.startswith("backbone.") for k in moved), moved[:5]
    assert any(k.startswith("neck.") for k in moved)


def test_a_torchvision_resnet_is_rtdetrs_backbone_with_pretrained(tmp_path, capsys):
    from torchvision.models import resnet18

    ref = resnet18(weights=None).eval()
    _randomise_bn(ref)
    torch.save(ref.state_dict(), tmp_path / "resnet18.pth")
    model = LibreYOLO("LibreRTDETRr18", pretrained=tmp_path / "resnet18.pth")
    model._start = (model.pretrained, 0)
    net = model.prepare_for_training(["a", "b"], fresh=True).eval()
    out = capsys.readouterr().out
    assert "RT-DETR's backbone (pretrained= only), LibreRTDETRr18 (part)" in out
    blocks = [k for k in ref.state_dict() if k.startswith("layer")]
    # every residual block, and stage 1's first shortcut as the identity (5 tensors: torchvision's block has none
    # there, the official RT-DETR's a 1x1 conv); the 7x7 stem and fc have no place
    assert f": {len(blocks) + 5} tensors loaded" in out
    # the blocks compute what torchvision's do, except the first block of layers 2-4, whose vd shortcut pools
    # before its 1x1 convolution where torchvision's strides it (the same weights, not the same function)
    x = torch.rand(1, 64, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for i, layer in enumerate((ref.layer1, ref.layer2, ref.layer3, ref.layer4)):
            ours = net.features.backbone.stages[i]
            if i == 0:
                torch.testing.assert_close(ours(x), layer(x), atol=1e-5, rtol=0)
            x = layer[0](x)
            torch.testing.assert_close(ours[1:](x), layer[1:](x), atol=1e-5, rtol=0)
            assert torch.equal(
                ours[0].downsample[1].weight if i else ours[0].conv1.weight,
                layer[0].downsample[0].weight if i else layer[0].conv1.weight,
            )
            x = layer[1:](x)
    with pytest.raises(CheckpointError, match="no known format"):
        torch.save({k: v for k, v in ref.state_dict().items() if k != "fc.weight"}, tmp_path / "headless.pth")
        LibreYOLO(tmp_path / "headless.pth")  # a backbone alone is no model


def test_a_pretrained_run_gets_the_learning_rate_and_warm_up_docs_weights_md_lists():
    from libreyolo.config import TrainConfig
    from libreyolo.families import families

    doc = (Path(__file__).parents[1] / "docs" / "weights.md").read_text()
    table = doc[doc.index("## Fine-tuning learning rates") :].split("\n\n")[2]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    assert {r[0] for r in rows} == {"yolo9", "yolox", "rtdetr", "resnet", "mnv4"}
    for name, optimizer, lr0, warmup, bias_lr in rows:
        cfg = TrainConfig.from_overrides({"pretrained": "start.pt"}, family=families()[name])
        assert (cfg.optimizer, cfg.lr0, cfg.warmup_epochs, cfg.warmup_bias_lr) == (
            optimizer, float(lr0), float(warmup), float(bias_lr)
        ), name  # fmt: skip
    for fam in families().values():  # no family's run changes a key because it starts from a file
        assert TrainConfig.from_overrides({"pretrained": "start.pt"}, family=fam).lr0 == (
            TrainConfig.from_overrides({}, family=fam).lr0
        )


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"decoder.decoder.layers.0.cross_attn.num_points_scale": torch.ones(12)}, "an RT-DETRv2 checkpoint"),
        ({"backbone.stem.stem1.conv.weight": torch.ones(1)}, r"an RT-DETR whose backbone is no ResNet-vd \(HGNetv2"),
    ],
)
def test_rtdetr_files_of_networks_not_built_here_are_refused_with_the_reason(tmp_path, extra, match):
    heads = {
        "decoder.dec_score_head.0.weight": torch.ones(80, 256),
        "decoder.enc_score_head.weight": torch.ones(80, 256),
    }
    torch.save({"model": {**heads, **extra}}, tmp_path / "rtdetr.pth")
    with pytest.raises(CheckpointError, match=f"rtdetr.pth: {match}"):
        LibreYOLO(tmp_path / "rtdetr.pth")
