"""COCO JSON datasets read directly: the demo set written as COCO JSON trains to the losses of its .txt form, and its
validation (iscrowd boxes ignored) gives faster-coco-eval's mAP on the same JSON (docs/reliability.md)."""

import json
import os
import types

import numpy as np
import pytest
import torch
from conftest import FAST

from libreyolo import LibreYOLO
from libreyolo.data import splits
from libreyolo.data.config import list_images, load_data_config
from libreyolo.data.dataset import YOLODataset
from libreyolo.data.labels import scan_labels
from libreyolo.data.loader import ValLoader
from libreyolo.data.splits import scan_split
from libreyolo.eval import coco as coco_eval
from libreyolo.eval.validator import validate
from libreyolo.events import read_events


def _write_coco(tiny_data, out, split, image_prefix="", crowd=True):
    """tiny_data's split as COCO JSON (category ids 1.. with gaps: 1, 3, 5); every other image gets a crowd box over
    its left half, which training must not see."""
    dc = load_data_config(tiny_data)
    files = list_images(getattr(dc, split))
    ls = scan_labels(files, dc.nc, use_cache=False)
    images, anns = [], []
    for k, (f, lab, (h, w)) in enumerate(zip(ls.files, ls.labels, ls.shapes)):
        images.append({"id": 100 + k, "file_name": image_prefix + f.name, "width": w, "height": h})
        for c, cx, cy, bw, bh in lab.tolist():
            box = [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h]
            anns.append({"id": len(anns) + 1, "image_id": 100 + k, "category_id": 1 + 2 * int(c), "bbox": box})
            anns[-1].update(area=box[2] * box[3], iscrowd=0)
        if crowd and k % 2:
            box = [0.0, 0.0, w / 2, float(h)]
            anns.append({"id": len(anns) + 1, "image_id": 100 + k, "category_id": 1, "bbox": box, "iscrowd": 1})
            anns[-1]["area"] = box[2] * box[3]
    cats = [{"id": 1 + 2 * i, "name": n} for i, n in enumerate(dc.names)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return out, ls


@pytest.fixture()
def coco2017(tiny_data, tmp_path):
    """The COCO 2017 layout: annotations/instances_{train,val}2017.json, train2017/ and val2017/."""
    for split in ("train", "val"):
        os.symlink(tiny_data.parent / "images" / split, tmp_path / f"{split}2017")
        _write_coco(tiny_data, tmp_path / "annotations" / f"instances_{split}2017.json", split)
    return tmp_path / "annotations" / "instances_train2017.json"


def test_the_common_layouts_are_found(tiny_data, coco2017, tmp_path, monkeypatch):
    dc = load_data_config(coco2017)  # COCO 2017: the val JSON beside, the images in ../train2017
    assert dc.names == ["circle", "square", "triangle"] and dc.val[0].name == "instances_val2017.json"
    train = scan_split(dc, "train", dc.nc, [])
    assert len(train) == 16 and train.files[0].parent == tmp_path / "train2017"
    assert sum(len(c) for c in train.crowd) == 8  # kept apart, not among the boxes trained on
    assert coco2017.with_name(coco2017.name + ".scan.npz").is_file()  # the image checks, cached as for .txt
    monkeypatch.setattr(splits, "image_check", lambda f: pytest.fail("the cache was not used"))
    again = scan_split(dc, "train", dc.nc, [])
    assert again.files == train.files and again.shapes == train.shapes
    monkeypatch.undo()
    rf = tmp_path / "rf"  # Roboflow's export: train/_annotations.coco.json beside its images, valid/ beside it
    for split, folder in (("train", "train"), ("val", "valid")):
        (rf / folder).mkdir(parents=True)
        for f in (tiny_data.parent / "images" / split).iterdir():
            os.symlink(f, rf / folder / f.name)
        _write_coco(tiny_data, rf / folder / "_annotations.coco.json", split)
    dc = load_data_config(rf / "train" / "_annotations.coco.json")
    assert dc.val == [rf / "valid" / "_annotations.coco.json"] and len(scan_split(dc, "val", 3, [])) == 8
    yaml = tmp_path / "d.yaml"  # a yaml naming the JSON files and the images' folder
    _write_coco(tiny_data, tmp_path / "ann" / "train.json", "train", image_prefix="train/")
    _write_coco(tiny_data, tmp_path / "ann" / "val.json", "val", image_prefix="val/")
    yaml.write_text(f"path: {tmp_path}\ntrain: ann/train.json\nval: ann/val.json\nimages: {tiny_data.parent}/images\n")
    dc = load_data_config(yaml)
    assert len(scan_split(dc, "train", 3, [])) == 16 and len(scan_split(dc, "val", 3, [])) == 8


def test_coco_json_trains_to_the_losses_of_the_txt_form(tiny_data, coco2017, tmp_path):
    def losses(data, name):
        m = LibreYOLO("LibreYOLO9t")
        m.train(**FAST, data=str(data), epochs=1, project=str(tmp_path / "runs"), name=name, seed=3)
        return [e["losses"] for e in read_events(m.last_run / "events.jsonl") if e["type"] == "epoch_end"]

    txt, js = losses(tiny_data, "txt"), losses(coco2017, "json")
    assert len(txt) == len(js) == 1
    for k in txt[0]:
        assert js[0][k] == pytest.approx(txt[0][k], rel=1e-4, abs=1e-6), k


def test_validation_on_coco_json_gives_faster_coco_evals_map_with_crowd_boxes_ignored(coco2017, monkeypatch):
    val_json = coco2017.with_name("instances_val2017.json")
    dc = load_data_config(coco2017)
    ls = scan_split(dc, "val", dc.nc, [])
    assert sum(len(c) for c in ls.crowd) == 4
    ds = YOLODataset(ls, 64, augment=False)
    rng = np.random.default_rng(0)
    current, seen = {}, {}

    class Loader(ValLoader):
        def __iter__(self):
            for batch in super().__iter__():
                current["batch"] = batch
                yield batch

    def postprocess(net, raw, imgsz, **kw):  # ground truth jittered, with wrong classes and clutter (some on crowds)
        t, m = current["batch"]["targets"], current["batch"]["mask"]
        out = []
        for b in range(t.shape[0]):
            gt = t[b][m[b]]
            boxes = torch.cat([gt[:, 1:5] + torch.from_numpy(rng.normal(0, 1.5, (len(gt), 4))).float(),
                               torch.from_numpy(rng.uniform(0, 40, (12, 2))).float().repeat(1, 2)
                               + torch.tensor([0.0, 0.0, 12.0, 12.0])])  # fmt: skip
            cls = torch.cat([gt[:, 0], torch.from_numpy(rng.integers(0, 3, 12)).float()])
            score = torch.from_numpy(rng.uniform(0.01, 1, len(boxes))).float()
            out.append(torch.column_stack([torch.full((len(boxes),), float(b)), boxes, score, cls]))
        return torch.cat(out)

    real = coco_eval.CocoAccumulator.evaluate

    def keep(self, *a, **k):
        seen["dt"] = np.concatenate(self._dt)
        return real(self, *a, **k)

    monkeypatch.setattr(coco_eval.CocoAccumulator, "evaluate", keep)
    family = types.SimpleNamespace(postprocess=postprocess, loss_terms=("box",))
    got = validate(torch.nn.Identity(), family, Loader(ds, 4, 0, False), torch.device("cpu"), dc.names)

    from faster_coco_eval import COCO, COCOeval_faster

    gt = COCO(str(val_json))
    by_name = {im["file_name"]: im["id"] for im in gt.dataset["images"]}
    results = [
        {
            "image_id": by_name[ls.files[int(i)].name],
            "category_id": 1 + 2 * int(c),
            "bbox": [x1, y1, x2 - x1, y2 - y1],
            "score": s,
        }
        for i, c, x1, y1, x2, y2, s in seen["dt"].tolist()
    ]
    ev = COCOeval_faster(gt, gt.loadRes(results), "bbox")
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    assert 0.1 < got["map"] < 0.95  # far from 0 and 1: the comparison means something
    assert got["map"] == pytest.approx(ev.stats[0], abs=1e-4) and got["map50"] == pytest.approx(ev.stats[1], abs=1e-4)
