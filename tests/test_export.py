"""libreyolo export: every family's ONNX (onnxruntime, CPU) and TorchScript graphs against PyTorch, predict and val
through the exported file, float16, dynamic and fixed batches, the NMS graph, and bad input refused with no file
left behind. Exports are shared across tests (module fixtures): tracing is the slow part."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")

from libreyolo import LibreYOLO  # noqa: E402
from libreyolo.errors import ConfigError  # noqa: E402
from tests.conftest import NO_AUG, repeated_shapes  # noqa: E402

MODELS = ["LibreYOLO9t", "LibreYOLOXn", "LibreRTDETRr18", "LibreResNet18", "LibreMNv4s"]
SIZE = 64


def _saved(name: str, folder: Path) -> LibreYOLO:
    """An untrained model of 3 classes, saved as weights (exports go beside them)."""
    torch.manual_seed(0)
    m = LibreYOLO(name, nc=3)
    m.imgsz = SIZE
    return LibreYOLO(str(m.save(folder / f"{name}.pt")))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (model, its .onnx, its .torchscript). The TorchScript-based ONNX exporter here (dynamo=false): the
    dynamo exporter takes 3-15 s a model on 2 cores; test_dynamo_exports_where_it_works covers it."""
    folder = tmp_path_factory.mktemp("exported")
    out = {}
    for name in MODELS:
        m = _saved(name, folder)
        out[name] = (m, m.export(dynamo=False, log=lambda s: None), m.export(format="torchscript", log=lambda s: None))
    return out


def _input(batch=2, size=SIZE, seed=1):
    return torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", MODELS)
def test_raw_outputs_of_onnx_and_torchscript_are_pytorchs_within_1e_4(exported, name):
    import onnxruntime as ort

    m, onnx_path, ts_path = exported[name]
    x = _input(batch=1)
    with torch.no_grad():
        want = m.net.eval()(x)
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = session.run(None, {"images": x.numpy()})
    ts = torch.jit.load(str(ts_path))(x)
    ts = [ts] if isinstance(ts, torch.Tensor) else list(ts)
    assert len(got) == len(want) == len(ts)
    for w, o, t in zip(want, got, ts):
        assert o.shape == tuple(w.shape) and np.abs(o - w.numpy()).max() < 1e-4
        assert (t - w).abs().max() < 1e-4


def _box_iou(a, b):
    import torchvision

    return torchvision.ops.box_iou(a, b)


def _same_predictions(a, b):
    """Results of two models on the same images: same count, classes and scores, boxes with IoU > 0.99."""
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert len(ra) == len(rb)
        if hasattr(ra, "boxes"):
            if len(ra):
                assert torch.equal(ra.classes, rb.classes)
                assert (_box_iou(ra.boxes, rb.boxes).diagonal() > 0.99).all()
        else:
            assert torch.equal(ra.classes, rb.classes)
        assert torch.allclose(ra.scores, rb.scores, atol=1e-4)


@pytest.mark.parametrize("name", ["LibreRTDETRr18", "LibreResNet18", "LibreMNv4s"])
def test_predict_through_the_exported_files_gives_pytorchs_results(exported, tiny_data, name):
    m, onnx_path, ts_path = exported[name]
    images = sorted((tiny_data.parent / "images" / "val").glob("*.jpg"))[:4]
    want = m.predict(images, conf=0.0, device="cpu")
    assert any(len(r) for r in want)
    for path in (onnx_path, ts_path):
        e = LibreYOLO(str(path))
        assert e.names == m.names and e.imgsz == SIZE and e.exported.format == path.suffix[1:]
        _same_predictions(want, e.predict(images, conf=0.0, device="cpu"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """LibreYOLO9t after 6 tiny epochs on 8 shapes images of 64 px: detections above conf 0.25 and an mAP above 0."""
    data = repeated_shapes(tmp_path_factory.mktemp("brief") / "shapes", size=SIZE)
    m = LibreYOLO("LibreYOLO9t")
    m.train(
        data=str(data), epochs=6, imgsz=SIZE, batch=8, nbs=8, workers=0, device="cpu", warmup_epochs=0, val=False,
        optimizer="AdamW", lr0=0.01, project=str(tmp_path_factory.mktemp("runs")), seed=0, **NO_AUG,
    )  # fmt: skip
    return m, data, sorted((data.parent / "images" / "train").glob("*.jpg"))


def test_val_and_predict_of_the_onnx_file_equal_the_weights(trained, capsys):
    m, data, images = trained
    path = m.export(dynamo=False, dynamic="batch", log=lambda s: None)
    assert path == m.last_run / "weights" / "best.onnx"
    e = LibreYOLO(str(path))
    want, got = m.val(str(data), device="cpu", workers=0), e.val(str(data), device="cpu", workers=0)
    assert want["map"] > 0 and abs(want["map"] - got["map"]) < 1e-3 and abs(want["map50"] - got["map50"]) < 1e-3
    for k, v in want["losses"].items():
        assert abs(v - got["losses"][k]) < 1e-4
    import json

    from libreyolo.cli.main import main

    capsys.readouterr()
    assert main(["val", f"model={path}", f"data={data}", "device=cpu", "workers=0", "json=true"]) == 0
    assert abs(json.loads(capsys.readouterr().out)["map"] - want["map"]) < 1e-3
    want = m.predict(images, conf=0.001, device="cpu")
    assert sum(len(r) for r in want) > 0
    _same_predictions(want, e.predict(images, conf=0.001, device="cpu"))


def test_val_of_the_torchscript_file_equals_the_weights(trained, capsys):
    m, data, _ = trained
    path = m.export(format="torchscript", log=lambda s: None)
    assert path == m.last_run / "weights" / "best.torchscript"
    want, got = m.val(str(data), device="cpu", workers=0), LibreYOLO(str(path)).val(str(data), device="cpu", workers=0)
    assert want["map"] > 0 and abs(want["map"] - got["map"]) < 1e-3 and abs(want["map50"] - got["map50"]) < 1e-3
    for k, v in want["losses"].items():
        assert abs(v - got["losses"][k]) < 1e-4
    import json

    from libreyolo.cli.main import main

    capsys.readouterr()
    assert main(["val", f"model={path}", f"data={data}", "device=cpu", "workers=0", "json=true"]) == 0
    assert abs(json.loads(capsys.readouterr().out)["map"] - want["map"]) < 1e-3


def _same_detection_sets(a, b):
    """The same detections in any order: every box of each result has one in the other of the same class, a score
    within 1e-4 and IoU > 0.99 (a briefly trained model scores many boxes alike, so the order of near-equal
    scores may differ between runtimes)."""
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert len(ra) == len(rb) > 0 and ((ra.boxes[:, 2:] - ra.boxes[:, :2]) > 0).all()  # real boxes
        fits = (
            (ra.classes[:, None] == rb.classes[None])
            & ((ra.scores[:, None] - rb.scores[None]).abs() < 1e-4)
            & (_box_iou(ra.boxes, rb.boxes) > 0.99)
        )
        assert fits.any(1).all() and fits.any(0).all()


def test_predict_through_exported_yolox_gives_the_weights_boxes(tmp_path):
    """An untrained YOLOX's activations vanish in eval mode (every box degenerate): it trains 6 tiny epochs first,
    then its 20 best boxes per image (conf 0) come out the same through ONNX and TorchScript."""
    data = repeated_shapes(tmp_path / "shapes", size=SIZE)
    m = LibreYOLO("LibreYOLOXn")
    m.train(
        data=str(data), epochs=6, imgsz=SIZE, batch=8, nbs=8, workers=0, device="cpu", warmup_epochs=0, val=False,
        optimizer="AdamW", lr0=0.01, project=str(tmp_path / "runs"), seed=0, **NO_AUG,
    )  # fmt: skip
    images = sorted((data.parent / "images" / "train").glob("*.jpg"))
    want = m.predict(images, conf=0.0, max_det=20, device="cpu")
    for path in (m.export(dynamo=False, log=lambda s: None), m.export(format="torchscript", log=lambda s: None)):
        _same_detection_sets(want, LibreYOLO(str(path)).predict(images, conf=0.0, max_det=20, device="cpu"))


def test_the_nms_graph_gives_predicts_boxes(trained):
    m, _, images = trained
    logs = []
    path = m.export(nms=True, dynamo=False, conf=0.001, file=str(m.last_run / "nms.onnx"), log=logs.append)
    assert "nms conf=0.001" in logs[0] and "torchscript-based" in logs[0]
    e = LibreYOLO(str(path))
    assert e.exported.nms == {"conf": 0.001, "iou": 0.7, "max_det": 300} and e.exported.outputs == ["detections"]
    want = m.predict(images, conf=0.001, device="cpu")
    assert sum(len(r) for r in want) > 0
    _same_predictions(want, e.predict(images, conf=0.001, device="cpu"))
    with pytest.raises(ConfigError, match="nms=true"):
        e.val("shapes")


def test_half_fixed_batch_and_dynamic_graphs(exported, tmp_path):
    m = exported["LibreYOLOXn"][0]
    x = _input(batch=3)
    with torch.no_grad():
        want = m.net.eval()(x)
    half = LibreYOLO(str(m.export(half=True, dynamo=False, file=str(tmp_path / "h.onnx"), log=lambda s: None)))
    assert half.exported.half and half.exported.batch == 1
    got = half.net(x)  # three runs of the batch-1 graph
    assert got.shape == want.shape and (got - want).abs().max() < 0.05 * want.abs().max()
    fixed = LibreYOLO(
        str(m.export(batch=2, dynamo=False, simplify=True, file=str(tmp_path / "b2.onnx"), log=lambda s: None))
    )
    assert (fixed.net(x) - want).abs().max() < 1e-4  # a piece of 2, then one padded
    with pytest.raises(ConfigError, match="64x64"):
        fixed.net(_input(batch=1, size=96))
    logs = []
    dyn = LibreYOLO(str(m.export(dynamic=True, dynamo=False, file=str(tmp_path / "d.onnx"), log=logs.append)))
    assert "any batch, any image size" in logs[0] and "2x3x96x96" in logs[1]
    x96 = _input(batch=3, size=96)
    with torch.no_grad():
        assert (dyn.net(x96) - m.net(x96)).abs().max() < 1e-4


def test_rtdetr_exports_in_float16_and_gives_pytorchs_outputs_as_a_set(exported, tmp_path):
    """At 64 px every encoder token is a query (84 < 300), so float16 and float32 hold the same queries; their
    order (a top-k of near-equal scores) may differ, so each query's (logits, box) row is matched to the nearest
    of the other: within 0.02, float16's precision on values up to ~5."""
    m = exported["LibreRTDETRr18"][0]
    e = LibreYOLO(str(m.export(half=True, dynamo=False, file=str(tmp_path / "h.onnx"), log=lambda s: None)))
    assert e.exported.half
    x = _input(batch=2)
    with torch.no_grad():
        want = torch.cat(m.net.eval()(x), -1)
    got = torch.cat(e.net(x), -1)
    assert got.shape == want.shape == (2, 84, 3 + 4)
    gap = torch.cdist(got, want)
    assert gap.min(-1).values.max() < 0.02 and gap.min(-2).values.max() < 0.02


def test_dynamo_exports_where_it_works_and_the_log_and_metadata_say_so(exported, tmp_path):
    m = exported["LibreMNv4s"][0]
    logs = []
    e = LibreYOLO(str(m.export(file=str(tmp_path / "mn.onnx"), log=logs.append)))
    assert "by the dynamo exporter, opset 18" in logs[0] and e.exported.exporter == "dynamo" and e.exported.opset == 18
    import onnx

    assert onnx.load(str(tmp_path / "mn.onnx")).opset_import[0].version == 18


def test_auto_falls_back_to_the_torchscript_based_exporter_and_says_why(tmp_path):
    from libreyolo.export.graph import graph_nms
    from libreyolo.export.onnx import export_onnx
    from libreyolo.export.options import parse_options

    class Nms(torch.nn.Module):  # data-dependent shapes: torch.export cannot guard on the candidate count
        def forward(self, x):
            b = x[..., :2] * 50
            return graph_nms(torch.cat((b, b + x[..., 2:4] * 20), -1), x[..., 4:], 0.3, 0.5, 10)

    logs = []
    _, exporter = export_onnx(Nms(), torch.rand(2, 40, 7), parse_options({}), ["detections"], logs.append)
    assert exporter == "torchscript-based" and "the dynamo exporter failed" in logs[0]
    with pytest.raises(ConfigError, match="dynamo exporter failed"):
        export_onnx(Nms(), torch.rand(2, 40, 7), parse_options({"dynamo": True}), ["detections"], logs.append)


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("LibreYOLOXn", {"format": "tflite"}, "format takes one of onnx, torchscript"),
        ("LibreResNet18", {"nms": True}, "has no NMS"),
        ("LibreRTDETRr18", {"dynamic": True}, "cannot be exported with dynamic=true"),
        ("LibreYOLOXn", {"nms": True, "format": "torchscript"}, "nms=true is for format=onnx"),
        ("LibreYOLOXn", {"nms": True, "dynamic": "batch"}, "one input shape"),
        ("LibreYOLOXn", {"imgsz": 70}, "multiple of 32"),
        ("LibreYOLOXn", {"opset_version": 18}, "unknown key 'opset_version'"),
    ],
)
def test_bad_input_is_a_clear_error_and_leaves_no_file(exported, tmp_path, name, kwargs, match):
    m = exported[name][0]
    with pytest.raises(ConfigError, match=match):
        m.export(file=str(tmp_path / "x.onnx"), log=lambda s: None, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_a_graph_that_fails_its_check_leaves_no_file(exported, tmp_path, monkeypatch):
    from libreyolo.export import core

    def broken(*a, **k):
        raise ConfigError("the check failed")

    monkeypatch.setattr(core, "_check", broken)
    with pytest.raises(ConfigError, match="the check failed"):
        exported["LibreMNv4s"][0].export(dynamo=False, file=str(tmp_path / "x.onnx"), log=lambda s: None)
    assert list(tmp_path.iterdir()) == []


def test_cli_exports_and_reads_back(exported, tmp_path, capsys):
    from libreyolo.cli.main import main

    m = exported["LibreMNv4s"][0]
    out = tmp_path / "m.torchscript"
    assert main(["export", f"model={m.source}", "format=torchscript", f"file={out}"]) == 0
    assert "exported LibreMNv4s" in capsys.readouterr().err and out.is_file()
    assert main(["export", f"model={m.source}", "dynamic=sometimes"]) == 2
    assert "dynamic='sometimes' is not valid" in capsys.readouterr().err
    assert LibreYOLO(str(out)).exported.family == "mnv4"
