"""Real-world dataset forms (issue 14): EXIF-rotated phone photos validate like plain ones, ground truth is
clipped like predictions, no labels at all is refused, segment polygons become boxes, Roboflow's layout, the
`validation:` alias, repeated .txt entries, truncated JPEGs, and a bad label line drops only that line."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from libreyolo.data.config import list_images, load_data_config
from libreyolo.data.dataset import YOLODataset
from libreyolo.data.labels import scan_labels
from libreyolo.data.loader import ValLoader
from libreyolo.errors import DataError
from libreyolo.eval.coco import CocoAccumulator
from libreyolo.eval.validator import validate
from libreyolo.nn import nms as N

W, H = 64, 40  # displayed size: landscape, so a quarter turn swaps the sides
LABELS = [  # per image: class cx cy w h of the displayed image
    [(0, 0.30, 0.40, 0.25, 0.40), (1, 0.70, 0.60, 0.30, 0.30)],
    [(1, 0.50, 0.50, 0.40, 0.50)],
    [(0, 0.20, 0.30, 0.20, 0.30), (0, 0.75, 0.70, 0.30, 0.40)],
]
# Pillow's exif_transpose applies these for orientations 2..8; storing the inverse of the displayed pixels
# with the tag makes every orientation display the same picture
_SHOWN = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_INVERSE = {**{o: t for o, t in _SHOWN.items()}, 6: Image.Transpose.ROTATE_90, 8: Image.Transpose.ROTATE_270}


def _picture(k: int) -> np.ndarray:
    """A smooth picture (JPEG keeps it) with a bright block in one corner, so a wrong turn is visible."""
    y, x = np.mgrid[0:H, 0:W]
    img = np.stack([x * 4, y * 6, np.full_like(x, 40 * k)], -1).astype(np.uint8)
    img[:10, :16] = 255
    return img


def _write_split(root: Path, orientation: int) -> Path:
    images = root / "images" / "val"
    labels = root / "labels" / "val"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    for k, boxes in enumerate(LABELS):
        im = Image.fromarray(_picture(k))
        exif = Image.Exif()
        if orientation != 1:
            im = im.transpose(_INVERSE[orientation])
            exif[0x0112] = orientation
        im.save(images / f"{k}.jpg", quality=95, exif=exif)
        (labels / f"{k}.txt").write_text("".join(" ".join(map(str, b)) + "\n" for b in boxes))
    y = root / "data.yaml"
    y.write_text("train: images/val\nval: images/val\nnames: [a, b]\n")
    return y


def _val_dataset(yaml_path: Path, cache: bool = False) -> YOLODataset:
    dc = load_data_config(yaml_path)
    return YOLODataset(scan_labels(list_images(dc.val), dc.nc, use_cache=cache), 64, augment=False)


class _FixedNet(torch.nn.Module):
    """Returns the same predictions (letterboxed pixels) whatever the input: jittered copies of the objects,
    some of the wrong class, plus clutter, so mAP is neither 0 nor 1."""

    def __init__(self, ds: YOLODataset, nc: int = 2):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        preds = []
        for i in range(len(ds)):
            gt = torch.as_tensor(ds[i]["boxes"]).reshape(-1, 5)
            boxes = torch.rand(20, 2, generator=g) * 50
            boxes = torch.cat((boxes, boxes + torch.rand(20, 2, generator=g) * 14 + 2), 1)
            scores = torch.rand(20, nc, generator=g) * 0.3
            for k, (c, *xyxy) in enumerate(gt.tolist()):
                for d in range(2):
                    j = 2 * k + d
                    boxes[j] = torch.tensor(xyxy) + torch.randn(4, generator=g) * (1 + 2 * d)
                    scores[j] = 0.01
                    scores[j, int(c) if d == 0 else 1 - int(c)] = 0.4 + 0.5 * torch.rand(1, generator=g).item()
            preds.append(torch.cat((boxes, scores), 1))
        self.preds = torch.stack(preds)

    def forward(self, x):
        return self.preds[: x.shape[0]]


_FAMILY = types.SimpleNamespace(
    postprocess=lambda net, raw, imgsz, conf, iou, max_det, multi_label: N.nms_packed(
        raw[..., :4], raw[..., 4:], conf, iou, max_det, multi_label
    ),
    loss_terms=("box", "cls"),
)


def _map(ds: YOLODataset, net: _FixedNet) -> dict:
    return validate(net, _FAMILY, ValLoader(ds, len(ds), 0, False), torch.device("cpu"), ["a", "b"])


def test_exif_orientations_2_to_8_validate_exactly_like_the_plain_images(tmp_path):
    plain = _val_dataset(_write_split(tmp_path / "o1", 1))
    net = _FixedNet(plain)
    ref = _map(plain, net)
    assert 0.1 < ref["map50"] < 0.99 and 0.05 < ref["map"] < 0.9
    for o in range(2, 9):
        ds = _val_dataset(_write_split(tmp_path / f"o{o}", o))
        got = _map(ds, net)
        for k in ("map50", "map", "precision", "recall"):
            assert got[k] == pytest.approx(ref[k], abs=1e-6), (o, k)
        # the scan records the displayed size, the decoder shows the displayed picture, the validator places
        # ground truth with that size
        assert ds.labels.shapes == [(H, W)] * len(LABELS), o
        for i in range(len(ds)):
            img, _ = ds.load(i)
            assert img.shape[:2] == (H, W), o
            assert np.abs(img.astype(int) - _picture(i)).mean() < 6, f"orientation {o}: decoded picture turned wrong"
        assert np.array_equal(ds.ground_truth()[0], plain.ground_truth()[0]), o


def test_a_label_cache_of_the_old_unrotated_sizes_is_not_reused(tmp_path, monkeypatch):
    from libreyolo.data import labels as L

    images = list_images(load_data_config(_write_split(tmp_path / "o6", 6)).val)
    monkeypatch.setattr(L, "CACHE_VERSION", 1)  # a cache as the scan before this fix wrote it: sizes unrotated
    ls = scan_labels(images, 2)
    ls.shapes = [(W, H)] * len(ls)
    L._save_cache(L.cache_path_for(images), L._fingerprint(images, 2)[0], ls)
    assert scan_labels(images, 2).shapes[0] == (W, H)  # the same version reads it back
    monkeypatch.undo()
    assert scan_labels(images, 2).shapes == [(H, W)] * len(ls)


def test_ground_truth_crossing_the_edge_is_clipped_like_the_predictions():
    # one 64 x 48 image; the object runs past the right edge (label cx 0.9 w 0.4 -> x 38.4..70.4)
    rows = np.array([[0, 0, 38.4, 10, 70.4, 30]])
    acc = CocoAccumulator(["a"], (rows, np.array([[48.0, 64.0]])))
    acc.add_batch(np.array([0]), np.array([[0, 38.4, 10, 64, 30, 0.9, 0]]))  # the perfect, clipped prediction
    out = acc.evaluate()
    assert out["map"] == pytest.approx(1.0) and out["map50"] == pytest.approx(1.0)
    one = CocoAccumulator(["a"])  # the image-at-a-time path clips the same way
    one.add(0, (48, 64), rows[:, 1:], np.array([[38.4, 10, 64, 30]]), np.array([0.9]), np.array([0]))
    assert one.evaluate()["map"] == pytest.approx(1.0)


def _detect_split(root: Path, n: int = 3, labels_dir: str = "labels") -> Path:
    (root / "images" / "train").mkdir(parents=True)
    (root / labels_dir / "train").mkdir(parents=True)
    for k in range(n):
        Image.fromarray(_picture(k)).save(root / "images" / "train" / f"{k}.jpg")
        (root / labels_dir / "train" / f"{k}.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    y = root / "data.yaml"
    y.write_text("train: images/train\nval: images/train\nnames: [a, b]\n")
    return y


def test_no_label_at_all_is_refused_unless_allowed(tmp_path):
    from libreyolo import LibreYOLO

    y = _detect_split(tmp_path / "ds", labels_dir="annotations")  # the labels folder is misnamed
    fast = dict(epochs=1, imgsz=64, batch=4, workers=0, warmup_epochs=0, device="cpu", project=str(tmp_path / "r"))
    with pytest.raises(DataError) as e:
        LibreYOLO("LibreYOLO9t").train(data=str(y), **fast)
    msg = str(e.value)
    assert "train: none of the 3 images has a box" in msg and "3 have no label file" in msg
    assert str(tmp_path / "ds" / "labels" / "train") in msg and "allow_empty=true" in msg
    warnings = []
    LibreYOLO("LibreYOLO9t").train(
        data=str(y), allow_empty=True, val=False, callbacks=[lambda ev: warnings.append(ev)], **fast
    )
    text = [w.message for w in warnings if w.type == "warning"]
    assert any("train: none of the 3 images has a box" in t for t in text)
    assert any("val: none of the 3 images has a box" in t and "mAP will be 0" in t for t in text)


def test_segment_polygons_become_their_bounding_boxes_with_one_note(tmp_path):
    from libreyolo.data.labels import scan_notes

    y = _detect_split(tmp_path / "ds")
    lab = tmp_path / "ds" / "labels" / "train"
    (lab / "0.txt").write_text("1 0.1 0.2 0.5 0.2 0.3 0.6\n0 0.5 0.5 0.2 0.2\n")
    (lab / "1.txt").write_text("0 0.2 0.2 0.4 0.2 0.4 0.5 0.2 0.5\n")
    ls = scan_labels(list_images(load_data_config(y).train), 2)
    assert not ls.skipped and ls.polygons == 2 and len(ls) == 3
    assert np.allclose(ls.labels[0], [[0, 0.5, 0.5, 0.2, 0.2], [1, 0.3, 0.4, 0.4, 0.4]])  # rows sorted
    assert np.allclose(ls.labels[1], [[0, 0.3, 0.35, 0.2, 0.3]])
    notes = [n for n in scan_notes(ls, "train") if "polygon" in n]
    assert len(notes) == 1 and "2 label lines are segment polygons" in notes[0]


def test_roboflow_layout_and_the_validation_alias(tmp_path):
    root = tmp_path / "rf"
    for split in ("train", "valid"):
        (root / split / "images").mkdir(parents=True)
        (root / split / "labels").mkdir(parents=True)
        Image.fromarray(_picture(0)).save(root / split / "images" / "a.jpg")
    y = root / "data.yaml"  # as Roboflow exports it: in the dataset's root, paths from one folder below
    y.write_text("train: ../train/images\nvalidation: ../valid/images\nnc: 1\nnames: ['thing']\n")
    dc = load_data_config(y)
    assert dc.train == [root / "train" / "images"] and dc.val == [root / "valid" / "images"]
    assert len(dc.notes) == 2 and "train: ../train/images does not exist; using" in dc.notes[0]
    assert str((root / "train" / "images").resolve()) in dc.notes[0]
    y.write_text("train: ../nowhere/images\nval: ../valid/images\nnames: [thing]\n")
    with pytest.raises(DataError, match=r"train: \.\./nowhere/images does not exist \(tried .*nowhere/images and "):
        load_data_config(y)


def test_repeated_entries_of_a_txt_list_are_kept(tmp_path):
    y = _detect_split(tmp_path / "ds")
    img = tmp_path / "ds" / "images" / "train"
    (tmp_path / "ds" / "train.txt").write_text(f"{img / '0.jpg'}\n{img / '0.jpg'}\n./images/train/1.jpg\n")
    y.write_text("train: train.txt\nval: images/train\nnames: [a, b]\n")
    files = list_images(load_data_config(y).train)
    assert [f.name for f in files] == ["0.jpg", "0.jpg", "1.jpg"]
    ls = scan_labels(files, 2)
    assert len(ls) == 3
    from libreyolo.data.diskcache import open_disk_cache

    disk = open_disk_cache([str(f) for f in ls.files], ls.shapes, ls.stamps, 64, "t", lambda n, f: None, progress=False)
    assert (disk.written, disk.reused) == (2, 0) and np.array_equal(disk.get(0), disk.get(1))  # one entry, shared


def test_a_truncated_jpeg_is_skipped_at_the_scan_and_by_data_prepare(tmp_path, capsys):
    from libreyolo.cli.data import prepare

    y = _detect_split(tmp_path / "ds", n=4)
    img = tmp_path / "ds" / "images" / "train"
    noise = np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)  # most of its bytes are pixels
    Image.fromarray(noise).save(img / "0.jpg", quality=95)
    whole = (img / "0.jpg").read_bytes()
    (img / "0.jpg").write_bytes(whole[: len(whole) * 2 // 3])  # cut short, as an interrupted copy leaves it
    (img / "1.jpg").write_bytes((img / "1.jpg").read_bytes() + b"\0" * 16)  # bytes after the end marker: fine
    ls = scan_labels(list_images(load_data_config(y).train), 2)
    assert len(ls) == 3 and [Path(f).name for f, _ in ls.skipped] == ["0.jpg"]
    assert "truncated JPEG" in ls.skipped[0][1]
    prepare(str(y), imgsz=64)
    err = capsys.readouterr().err
    assert f"bad {img / '0.jpg'}: truncated JPEG" in err.replace("\n", "")


def test_a_bad_label_line_drops_only_that_line(tmp_path):
    from libreyolo.data.labels import scan_notes

    y = _detect_split(tmp_path / "ds")
    lab = tmp_path / "ds" / "labels" / "train"
    (lab / "0.txt").write_text("0 0.5 0.5 0.2 0.2\n5 0.5 0.5 0.2 0.2\n1 0.3 0.3 0.1\n1 0.4 0.4 0.2 0.2\n")
    (lab / "1.txt").write_text("0 0.5 0.5 nan_or_text 0.2\n")  # its only line is bad: the image is skipped
    images = list_images(load_data_config(y).train)
    for _ in range(2):  # the scan, then the label cache
        ls = scan_labels(images, 2)
        assert [Path(f).name for f, _ in ls.skipped] == ["1.jpg"]
        assert [len(x) for x in ls.labels] == [2, 1]
        assert [w for w, _ in ls.bad_lines] == [f"{lab / '0.txt'}:2", f"{lab / '0.txt'}:3"]
        assert "class 5 is out of range 0..1" in ls.bad_lines[0][1]
    notes = scan_notes(ls, "train")
    assert f"train: dropped label line {lab / '0.txt'}:3: expected 5 values" in "\n".join(notes)


def test_data_prepare_counts_dropped_label_lines(tmp_path, capsys):
    from libreyolo.cli.data import prepare

    y = _detect_split(tmp_path / "ds")
    (tmp_path / "ds" / "labels" / "train" / "0.txt").write_text("0 0.5 0.5 0.2 0.2\n0 0.5 0.5 0.2\n")
    prepare(str(y), imgsz=64)
    out = capsys.readouterr()
    assert "dropped label line" in out.err and "every image and label is usable" not in out.out
    assert "2 bad label line(s)" in out.out  # one per split: train and val read the same folder
