"""Data faults met in the wild: linked folders (train, val, predict), a byte order mark, comment lines in image
lists, a truncated JPEG given to predict, extreme aspect ratios mapped back per axis (docs/reliability.md)."""

import os
import shutil
import types
import warnings

import cv2
import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.cli.main import main
from libreyolo.data.config import list_images, load_data_config
from libreyolo.data.dataset import YOLODataset
from libreyolo.data.labels import LabelSet, scan_labels
from libreyolo.data.loader import ValLoader
from libreyolo.data.splits import scan_split
from libreyolo.eval.validator import validate
from libreyolo.predict import Predictions, TruncatedImageWarning, _detect


def test_linked_folders_are_followed_for_train_val_and_predict_and_a_loop_is_walked_once(tiny_data, tmp_path):
    root = tmp_path / "set"
    shutil.copytree(tiny_data.parent, root)
    outside = tmp_path / "outside"
    for sub in ("images", "labels"):  # 4 more training images live elsewhere, linked in
        (outside / sub).mkdir(parents=True)
        for img in sorted((root / sub / "val").iterdir())[:4]:
            shutil.copy(img, outside / sub / img.name.replace(".", "_more."))
        os.symlink(outside / sub, root / sub / "train" / "more")
    os.symlink(root / "images" / "val", root / "images" / "val" / "loop")  # a link back into its own folder
    dc = load_data_config(root / "data.yaml")
    dc.train, dc.val = [root / "images" / "train"], [root / "images" / "val"]
    notes = []
    train, val = scan_split(dc, "train", dc.nc, notes), scan_split(dc, "val", dc.nc, notes)
    assert len(train) == 16 + 4 and sum(len(x) for x in train.labels[-4:]) > 0  # the linked ones, with labels
    assert len(val) == 8 and len({str(f) for f in val.files}) == 8
    got = LibreYOLO("LibreYOLO9t").predict(str(root / "images" / "train"), imgsz=64, device="cpu")
    assert len(got) == 20 and sum("more" in r.path for r in got) == 4


def test_a_byte_order_mark_and_comment_lines_are_not_read_as_data(tiny_data, tmp_path):
    images = sorted((tiny_data.parent / "images" / "train").glob("*.jpg"))[:3]
    listing = tmp_path / "list.txt"
    listing.write_text("\ufeff# three training images\n" + "\n".join(map(str, images)) + "\n  # the end\n")
    assert list_images([listing]) == images
    img = tmp_path / "images" / "a.jpg"
    img.parent.mkdir()
    shutil.copy(images[0], img)
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "a.txt").write_bytes("\ufeff0 0.5 0.5 0.2 0.2\n1 0.3 0.3 0.1 0.1\n".encode())
    ls = scan_labels([img], 3, use_cache=False)
    assert ls.bad_lines == [] and sorted(ls.labels[0][:, 0].tolist()) == [0.0, 1.0]


def test_predict_names_a_truncated_jpeg_in_the_api_and_the_cli(tiny_data, tmp_path, capsys):
    src = sorted((tiny_data.parent / "images" / "val").glob("*.jpg"))[0]
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    with pytest.warns(TruncatedImageWarning, match=str(cut)):
        got = LibreYOLO("LibreYOLO9t").predict(str(cut), imgsz=64, device="cpu")
    assert len(got) == 1  # predicted on what could be decoded
    assert main(["predict", f"source={cut}", "imgsz=64", "device=cpu"]) == 0
    err = capsys.readouterr().err
    assert f"warning: {cut}: truncated JPEG" in err and "Traceback" not in err


def _extreme(tmp_path):
    """A 4000x20 and a 300x4000 image, one box each (normalised cx cy w h)."""
    files, labels, shapes = [], [], []
    for name, (w, h), box in (("wide", (4000, 20), (0.5, 0.5, 0.5, 0.8)), ("tall", (300, 4000), (0.3, 0.5, 0.4, 0.5))):
        path = tmp_path / f"{name}.png"
        cv2.imwrite(str(path), np.full((h, w, 3), 255, np.uint8))
        files.append(path)
        labels.append(np.array([[0, *box]], np.float32))
        shapes.append((h, w))
    return LabelSet(files, labels, shapes)


def test_perfect_predictions_on_extreme_aspect_ratios_score_map_1(tmp_path):
    ds = YOLODataset(_extreme(tmp_path), 96, augment=False)
    current = {}

    class Loader(ValLoader):
        def __iter__(self):
            for batch in super().__iter__():
                current["batch"] = batch
                yield batch

    def postprocess(net, raw, imgsz, **kw):  # the ground truth, where the letterbox put it: a perfect detector
        t, m = current["batch"]["targets"], current["batch"]["mask"]
        b, k = m.nonzero(as_tuple=True)
        return torch.cat([b[:, None].float(), t[b, k, 1:5], torch.ones(len(b), 1), t[b, k, :1]], 1)

    family = types.SimpleNamespace(postprocess=postprocess, loss_terms=("box",))
    net = torch.nn.Identity()
    m = validate(net, family, Loader(ds, 2, 0, False), torch.device("cpu"), ["a"])
    assert m["map"] == pytest.approx(1.0) and m["map50"] == pytest.approx(1.0), m


def test_predict_maps_boxes_back_per_axis(tmp_path):
    """A detector that finds the image inside the letterbox (white, where the padding is grey): its box maps back
    onto the whole image, for each axis with its own scale."""

    def postprocess(net, x, imgsz, **kw):
        out = []
        for b in range(x.shape[0]):
            ys, xs = (x[b, 0] > 0.9).nonzero(as_tuple=True)
            box = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
            out.append(torch.tensor([b, *box, 1.0, 0.0]).float())
        return torch.stack(out)

    model = types.SimpleNamespace(
        net=torch.nn.Identity(), family=types.SimpleNamespace(postprocess=postprocess), names=["a"]
    )
    files = [str(f) for f in _extreme(tmp_path).files]
    kw = dict(conf=0.25, iou=0.7, imgsz=96, max_det=10, batch=2, multi_label=False)
    with warnings.catch_warnings():
        results = list(_detect(model, files, "cpu", Predictions(), **kw))
    for r in results:
        h, w = r.orig_shape
        torch.testing.assert_close(r.boxes[0], torch.tensor([0.0, 0.0, w, h]), atol=1e-3, rtol=0)
