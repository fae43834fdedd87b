"""predict and val on real-world input (issue 14): unreadable images are skipped, odd image shapes and channel
counts are accepted, thresholds are range-checked, and val's mAP is reproduced from predict's output."""

import re
import shutil

import cv2
import numpy as np
import pytest
import torch
from conftest import NO_AUG, repeated_shapes

from libreyolo import LibreYOLO
from libreyolo.cli.main import main
from libreyolo.data.augment import letterbox
from libreyolo.errors import ConfigError, DataError
from libreyolo.predict import UnreadableImageWarning

NAMES = ["circle", "square", "triangle"]


@pytest.fixture()
def model():
    torch.manual_seed(0)
    m = LibreYOLO("LibreYOLO9t", nc=3, names=NAMES)
    m.imgsz = 64
    return m


@pytest.fixture()
def images(tiny_data, tmp_path):
    """Two readable images and one that is not (a truncated file with a .jpg name), in one folder."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    for f in sorted((tiny_data.parent / "images" / "val").glob("*.jpg"))[:2]:
        shutil.copy(f, folder / f.name)
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    return folder


def test_an_unreadable_image_is_skipped_and_the_others_are_predicted(model, images):
    with pytest.warns(UnreadableImageWarning, match="broken.jpg"):
        res = model.predict(images, device="cpu", conf=0.0)
    assert [r.path.rsplit("/", 1)[-1] for r in res] == sorted(p.name for p in images.glob("*.jpg"))[1:]
    assert [f.rsplit("/", 1)[-1] for f, _ in res.skipped] == ["broken.jpg"]
    with (
        pytest.raises(DataError, match=r"none of the 1 images could be read: .*broken.jpg"),
        pytest.warns(UnreadableImageWarning) as seen,
    ):
        model.predict(images / "broken.jpg", device="cpu")
    assert seen[0].filename == __file__  # the warning points at the caller's line


def test_cli_predict_names_the_skipped_file_and_fails_only_when_nothing_was_read(model, images, tmp_path, capsys):
    ckpt = model.save(tmp_path / "m.pt")
    assert main(["predict", f"model={ckpt}", f"source={images}", "device=cpu", "json=true"]) == 0
    cap = capsys.readouterr()
    assert cap.out.count('"path"') == 2  # both readable images have their line
    assert re.search(r"skipped .*broken\.jpg", cap.err) and "1 of 3 images could not be read" in cap.err
    assert main(["predict", f"model={ckpt}", f"source={images / 'broken.jpg'}", "device=cpu"]) == 2
    assert "broken.jpg" in capsys.readouterr().err


def test_a_very_thin_image_keeps_a_pixel_after_letterbox(model):
    img = np.full((20, 4000, 3), 200, np.uint8)  # 4000 wide, 20 high: 0.32 px high at imgsz 64
    out, r, (px, py) = letterbox(img, 64)
    assert out.shape == (64, 64, 3) and r == 64 / 4000
    assert len(model.predict(img, device="cpu", imgsz=64)) == 1
    assert len(model.predict(img.transpose(1, 0, 2).copy(), device="cpu", imgsz=64)) == 1


def test_gray_and_bgra_numpy_images_are_accepted_as_their_bgr_equivalent(model, tiny_data):
    bgr = cv2.imread(str(sorted((tiny_data.parent / "images" / "val").glob("*.jpg"))[0]))
    gray = cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)
    bgra = cv2.cvtColor(bgr, cv2.COLOR_BGR2BGRA)
    kw = dict(device="cpu", conf=0.0, max_det=20)
    want_gray = model.predict(cv2.cvtColor(gray, cv2.COLOR_GRAY2BGR), **kw)[0]
    for arr in (gray, gray[..., None]):
        got = model.predict(arr, **kw)[0]
        assert got.orig_shape == gray.shape and torch.equal(got.boxes, want_gray.boxes)
    want, got = model.predict(bgr, **kw)[0], model.predict(bgra, **kw)[0]
    assert torch.equal(got.boxes, want.boxes) and torch.equal(got.scores, want.scores)
    with pytest.raises(DataError, match=r"shape \(64, 64, 2\)"):
        model.predict(np.zeros((64, 64, 2), np.uint8), device="cpu")


@pytest.mark.parametrize("key,value", [("conf", 2), ("conf", -0.1), ("iou", 1.5)])
def test_conf_and_iou_must_lie_in_0_to_1(model, tiny_data, key, value):
    with pytest.raises(ConfigError, match=rf"{key}={value!r} is not valid: {key} takes a number from 0 to 1"):
        model.predict(np.zeros((64, 64, 3), np.uint8), device="cpu", **{key: value})
    with pytest.raises(ConfigError, match=rf"{key}={value!r} is not valid"):
        model.val(str(tiny_data), device="cpu", **{key: value})


def test_cli_val_conf_2_is_refused(capsys):
    assert main(["val", "conf=2"]) == 2
    assert "conf='2' is not valid: conf takes a number from 0 to 1" in capsys.readouterr().err


def test_val_split_that_the_yaml_lacks_names_the_split_and_the_ones_it_has(model, tiny_data, tmp_path, capsys):
    with pytest.raises(DataError, match=r"split='bogus': .*data.yaml has no 'bogus' split; its splits are train, val"):
        model.val(str(tiny_data), split="bogus", device="cpu")
    ckpt = model.save(tmp_path / "m.pt")
    assert main(["val", f"model={ckpt}", f"data={tiny_data}", "split=bogus", "device=cpu"]) == 2
    err = capsys.readouterr().err
    assert "has no 'bogus' split; its splits are train, val" in err and "Traceback" not in err


def test_val_and_predict_key_errors_point_to_their_own_help(model, tiny_data, capsys):
    assert main(["val", "conff=0.5"]) == 2
    assert "Did you mean conf? See `libreyolo val --help`" in capsys.readouterr().err
    assert main(["predict", "source=x.jpg", "iuo=0.5"]) == 2
    assert "Did you mean iou? See `libreyolo predict --help`" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"unknown key 'epochs'.*See `libreyolo val --help`"):
        model.val(str(tiny_data), epochs=3)
    for command in ("val", "predict"):
        assert main([command, "--help"]) == 0
        out = capsys.readouterr().out
        assert f"usage: libreyolo {command}" in out and re.search(r"^\s*multi_label\s+'auto'", out, re.M)


# --- val's mAP from predict's output ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def briefly_trained(tmp_path_factory):
    """LibreYOLO9t after 6 tiny epochs on 8 shapes images of 64 px (each 4 times per epoch): far from good, but
    with hundreds of detections at conf 0.001 and an mAP above 0 that multi_label changes (on AVX-512 as on AVX2
    alone; after 4 epochs an AVX-512 CPU's rounding left 8-24 detections)."""
    data = repeated_shapes(tmp_path_factory.mktemp("brief") / "shapes", size=64)
    root = data.parent
    m = LibreYOLO("LibreYOLO9t")
    m.train(
        data=str(data), epochs=6, imgsz=64, batch=8, nbs=8, workers=0, device="cpu", warmup_epochs=0, val=False,
        optimizer="AdamW", lr0=0.01, project=str(tmp_path_factory.mktemp("runs")), seed=0, **NO_AUG,
    )  # fmt: skip
    return m, data, sorted((root / "images" / "train").glob("*.jpg"))


def _coco_map(images, results):
    """COCO mAP50-95 and mAP50 of predict() results, evaluated as pycocotools does (faster-coco-eval's COCOeval,
    default parameters) against the YOLO label files."""
    from faster_coco_eval import COCO, COCOeval_faster

    imgs, gts, dts = [], [], []
    for i, (path, r) in enumerate(zip(images, results, strict=True)):
        h, w = r.orig_shape
        imgs.append({"id": i, "height": h, "width": w})
        for line in (path.parents[2] / "labels" / "train" / f"{path.stem}.txt").read_text().split("\n"):
            if line.strip():
                c, cx, cy, bw, bh = map(float, line.split())
                box = [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h]
                gts.append({"id": len(gts) + 1, "image_id": i, "category_id": int(c), "bbox": box})
                gts[-1].update(area=box[2] * box[3], iscrowd=0)
        for d in r.to_list():
            x1, y1, x2, y2 = d["box"]
            dts.append(
                {"image_id": i, "category_id": d["class"], "bbox": [x1, y1, x2 - x1, y2 - y1], "score": d["score"]}
            )
    cats = [{"id": k, "name": n} for k, n in enumerate(NAMES)]
    quiet = {"print_function": lambda *a, **k: None}
    cgt = COCO({"images": imgs, "annotations": gts, "categories": cats}, **quiet)
    ev = COCOeval_faster(cgt, cgt.loadRes(dts), "bbox", **quiet)
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    return ev.stats[0], ev.stats[1], len(dts)


@pytest.mark.parametrize("multi_label", [True, False])
def test_val_map_equals_coco_eval_of_predict_output(briefly_trained, multi_label):
    m, data, images = briefly_trained
    v = m.val(str(data), device="cpu", workers=0, multi_label=multi_label)
    res = m.predict(images, conf=0.001, max_det=300, device="cpu", multi_label=multi_label)
    mAP, map50, n = _coco_map(images, res)
    assert n == v["detections"] > 100 and v["map50"] > 0
    assert (v["map"], v["map50"]) == pytest.approx((mAP, map50), abs=1e-9)


def test_multi_label_auto_is_true_in_val_and_false_in_predict(briefly_trained):
    m, data, images = briefly_trained
    assert m.val(str(data), device="cpu", workers=0)["detections"] == sum(
        len(r) for r in m.predict(images, conf=0.001, device="cpu", multi_label=True)
    )
    single = m.predict(images, conf=0.001, device="cpu")
    assert [len(r) for r in single] == [len(r) for r in m.predict(images, conf=0.001, device="cpu", multi_label=False)]
    assert sum(map(len, single)) < m.val(str(data), device="cpu", workers=0, multi_label=True)["detections"]
