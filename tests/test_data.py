from pathlib import Path

import numpy as np
import pytest
import torch

from libreyolo.data.config import list_images, load_data_config
from libreyolo.data.dataset import AugmentConfig, YOLODataset, capacity, collate
from libreyolo.data.labels import scan_labels
from libreyolo.data.loader import train_loader
from libreyolo.errors import DataError


def _dataset(yaml_path, imgsz=64, augment=True):
    dc = load_data_config(yaml_path)
    return YOLODataset(
        scan_labels(list_images(dc.train), dc.nc, use_cache=False), imgsz, augment, AugmentConfig(), seed=0
    )


def test_yaml_errors_name_the_file_and_key(tmp_path):
    y = tmp_path / "d.yaml"
    with pytest.raises(DataError, match=str(y)):
        load_data_config(y)
    y.write_text("train: images/train\nnames: [a]\n")
    with pytest.raises(DataError, match=rf"{y}: key 'val' is missing"):
        load_data_config(y)
    y.write_text("train: nowhere\nval: nowhere\nnames: [a]\n")
    with pytest.raises(DataError, match=r"train: .*nowhere does not exist"):
        load_data_config(y)
    (tmp_path / "imgs").mkdir()
    y.write_text("train: imgs\nval: imgs\nnames: [a, b]\nnc: 3\n")
    with pytest.raises(DataError, match="nc=3 but 'names' has 2"):
        load_data_config(y)
    y.write_text("train: imgs\nval: imgs\nnames: {0: a, 2: b}\n")
    with pytest.raises(DataError, match="without gaps"):
        load_data_config(y)


def test_bad_labels_and_images_are_skipped_and_named(tiny_data, tmp_path):
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(tiny_data.parent, root)
    lab = root / "labels" / "train"
    files = sorted(lab.glob("*.txt"))
    files[0].write_text("7 0.5 0.5 0.2 0.2\n")  # class out of range
    files[1].write_text("0 0.5 0.5\n")  # malformed
    files[2].write_text("0 0.5 zero 0.2 0.2\n")  # not a number
    (root / "images" / "train" / "broken.jpg").write_bytes(b"not an image at all")
    dc = load_data_config(root / "data.yaml")
    ls = scan_labels(list_images(dc.train), dc.nc)
    reasons = dict(ls.skipped)
    assert len(ls.skipped) == 4 and len(ls) == 16 - 3
    assert any("class 7 is out of range 0..2" in r and f"{files[0]}:1" in r for r in reasons.values())
    assert any("expected 5 values" in r and str(files[1]) in r for r in reasons.values())
    assert any("not a number" in r for r in reasons.values())
    assert "unreadable image" in reasons[str(root / "images" / "train" / "broken.jpg")]
    # the label cache gives the same answer without re-reading
    again = scan_labels(list_images(dc.train), dc.nc)
    assert again.skipped == ls.skipped and [len(x) for x in again.labels] == [len(x) for x in ls.labels]


def test_samples_are_uint8_with_boxes_inside_and_pure_functions_of_seed_epoch_index(tiny_data):
    ds = _dataset(tiny_data)
    a, b = ds[(3, 5, True)], ds[(3, 5, True)]
    assert a["img"].dtype == np.uint8 and a["img"].shape == (64, 64, 3)
    assert np.array_equal(a["img"], b["img"]) and np.array_equal(a["boxes"], b["boxes"])
    assert not np.array_equal(a["img"], ds[(3, 6, True)]["img"])
    bx = a["boxes"]
    assert (bx[:, 1:] >= 0).all() and (bx[:, 1:] <= 64).all() and (bx[:, 3] > bx[:, 1]).all()


def test_collate_pads_targets_to_a_multiple_of_eight():
    assert [capacity(n) for n in (0, 1, 4, 5, 8, 9, 17, 24, 25, 150)] == [4, 4, 4, 8, 8, 16, 24, 24, 32, 152]
    # monotonic: a bound's capacity is never below the capacity of a batch with fewer boxes
    caps = [capacity(n) for n in range(700)]
    assert caps == sorted(caps) and all(c >= n for n, c in enumerate(caps))
    s = [
        {"img": np.zeros((8, 8, 3), np.uint8), "boxes": np.ones((n, 5), np.float32), "index": i, "bad": []}
        for i, n in enumerate((1, 5))
    ]
    b = collate(s)
    assert b["img"].shape == (2, 8, 8, 3) and b["img"].dtype == torch.uint8
    assert b["targets"].shape == (2, 8, 5) and b["mask"].sum(1).tolist() == [1, 5]


def test_workers_0_and_2_give_identical_batches(tiny_data):
    ds = _dataset(tiny_data)
    batches = []
    for workers in (0, 2):
        dl = train_loader(ds, 4, workers, seed=0, pin=False)
        dl.batch_sampler.set_epoch(1, True)
        batches.append(list(dl))
    for x, y in zip(*batches):
        assert torch.equal(x["img"], y["img"]) and torch.equal(x["targets"], y["targets"])


def test_a_pass_over_several_epochs_gives_each_epochs_own_batches(tiny_data):
    """One loader pass spanning epochs (the trainer's, so workers never idle between epochs) yields exactly the
    batches of one pass per epoch, in order, the first epoch from its resume step."""
    ds = _dataset(tiny_data)
    dl = train_loader(ds, 4, 2, seed=0, pin=False)
    per_epoch = []
    for epoch, mosaic, start in ((2, True, 1), (3, True, 0), (4, False, 0)):
        dl.batch_sampler.set_epoch(epoch, mosaic, start)
        per_epoch += list(dl)
    dl.batch_sampler.set_span([(2, True), (3, True), (4, False)], start=1)
    assert len(dl) == 3 * 4 - 1  # 16 images, batch 4
    spanned = list(dl)
    assert len(spanned) == len(per_epoch) == 11
    for x, y in zip(spanned, per_epoch):
        assert torch.equal(x["index"], y["index"]) and torch.equal(x["img"], y["img"])
    assert not torch.equal(spanned[2]["img"], spanned[5]["img"])  # epochs differ: not one epoch repeated


def test_unreadable_image_at_load_time_is_replaced_and_reported(tiny_data, tmp_path):
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(tiny_data.parent, root)
    ds = _dataset(root / "data.yaml")
    victim = Path(ds.files[2])
    victim.write_bytes(b"")  # broken after the scan, as a flaky disk would
    out = ds[(2, 0, False)]
    assert out["bad"] == [str(victim)] and out["index"] == 3
