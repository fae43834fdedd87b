"""`libreyolo data dense`: labels the project's own scanner accepts, boxes inside the image, objects per image as
asked (range or schedule), determinism per seed (pool or not), and the CLI's refusals."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from libreyolo.cli.data import run
from libreyolo.data.config import list_images, load_data_config
from libreyolo.data.dense import MIN_VISIBLE, NAMES, _place, draw_scene, make_dense
from libreyolo.data.labels import scan_labels
from libreyolo.errors import ConfigError


def _boxes_per_image(root: Path, split: str) -> list[int]:
    files = sorted((root / "labels" / split).glob("*.txt"))
    return [sum(1 for line in f.read_text().splitlines() if line.strip()) for f in files]


def _digest(root: Path) -> dict[str, str]:
    return {
        str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest() for f in root.rglob("*") if f.is_file()
    }


def test_labels_scan_clean_with_boxes_inside_and_counts_in_range(tmp_path):
    yaml_path = make_dense(tmp_path / "d", 12, 4, size=160, objects=(3, 12))
    dc = load_data_config(yaml_path)
    assert dc.names == NAMES
    shapes = set()
    for split, n in (("train", 12), ("val", 4)):
        ls = scan_labels(list_images(getattr(dc, split)), dc.nc, use_cache=False)
        assert len(ls) == n and not ls.skipped and not ls.bad_lines and ls.backgrounds == 0 and ls.polygons == 0
        for labels, (h, w) in zip(ls.labels, ls.shapes):
            assert 3 <= len(labels) <= 12
            cls, cx, cy, bw, bh = labels.T
            assert ((cls >= 0) & (cls < 10) & (cls == cls.round())).all()
            assert (bw * w >= 2).all() and (bh * h >= 2).all()  # a few pixels at least, never degenerate
            eps = 1e-5  # six decimals in the label file
            assert (cx - bw / 2 >= -eps).all() and (cx + bw / 2 <= 1 + eps).all()
            assert (cy - bh / 2 >= -eps).all() and (cy + bh / 2 <= 1 + eps).all()
            shapes.add((h, w))
        assert ls.boxes == sum(_boxes_per_image(tmp_path / "d", split))  # no line dropped or merged as duplicate
    assert (160, 160) in shapes and any(h != w for h, w in shapes)  # square and letterboxed images both occur
    assert not list(tmp_path.glob("d.partial-*"))


def test_schedule_sets_objects_per_segment_and_val_cycles(tmp_path):
    root = tmp_path / "s"
    make_dense(root, 12, 3, size=160, objects=[2, 10, 30])
    train = _boxes_per_image(root, "train")
    assert train[:4] == [2] * 4  # 10% of 2 rounds to nothing
    assert all(9 <= c <= 11 for c in train[4:8]) and all(27 <= c <= 33 for c in train[8:]), train
    val = _boxes_per_image(root, "val")
    assert val[0] == 2 and 9 <= val[1] <= 11 and 27 <= val[2] <= 33, val


def test_150_objects_fit_one_image():
    img, rows = draw_scene(np.random.default_rng(3), 640, 150, n_distractors=30)
    assert len(rows) == 150 and img.dtype == np.uint8 and max(img.shape[:2]) == 640
    sides = np.array([max(r[3] * img.shape[1], r[4] * img.shape[0]) for r in rows])
    assert sides.min() < 12  # dense images are mostly tiny objects


def test_placement_keeps_every_object_at_least_half_visible():
    """Crowding one small canvas far past what fits: placements that would hide more than half of an earlier
    object (or of the new one, at the border) are refused, and the bookkeeping matches the pixels."""
    rng = np.random.default_rng(0)
    img, owner = np.zeros((90, 120, 3), np.uint8), np.full((90, 120), -1, np.int32)
    full: list[int] = []
    visible: list[int] = []
    placed = [_place(rng, img, owner, full, visible, int(rng.integers(10)), rng.uniform(6, 50)) for _ in range(200)]
    kept = [p for p in placed if p is not None]
    assert 10 < len(kept) < 200  # the canvas was filled, and the rule refused some
    for k, (y0, x0, y1, x1) in enumerate(kept):
        shown = int((owner == k).sum())
        assert shown == visible[k] >= MIN_VISIBLE * full[k] > 0
        assert int((owner[y0:y1, x0:x1] == k).sum()) == shown  # the returned region holds all of it


def test_same_seed_same_files_in_a_pool_or_not_other_seed_differs(tmp_path):
    a = _digest(Path(make_dense(tmp_path / "a", 6, 2, size=96, seed=7, classes=4, workers=0)).parent)
    b = _digest(Path(make_dense(tmp_path / "b", 6, 2, size=96, seed=7, classes=4, workers=2)).parent)
    c = _digest(Path(make_dense(tmp_path / "c", 6, 2, size=96, seed=8, classes=4, workers=0)).parent)
    assert a == b and len(a) == 6 * 2 + 2 * 2 + 1
    differ = [k for k in a if a[k] != c[k]]
    assert sum(k.endswith(".jpg") for k in differ) == 8 and sum(k.endswith(".txt") for k in differ) == 8
    classes = {int(line.split()[0]) for f in (tmp_path / "a" / "labels").rglob("*.txt") for line in f.open()}
    assert classes <= {0, 1, 2, 3} and len(classes) > 1
    assert "names:\n  0: circle\n  1: square\n  2: triangle\n  3: cross\n" in (tmp_path / "a" / "data.yaml").read_text()


@pytest.mark.parametrize(
    "args, message",
    [
        (["objectz=3"], "unknown key 'objectz'. Did you mean objects?"),
        (["objects=5-2"], "objects='5-2' is not valid"),
        (["objects=many"], "objects='many' is not valid"),
        (["counts=2,x"], "counts='2,x' is not valid"),
        (["counts=2,401"], "counts='2,401' is not valid"),
        (["objects=2-4", "counts=3"], "objects=2-4 and counts=3: give one"),
        (["classes=11"], "classes=11: between 1 and 10"),
        (["size=16"], "size >= 32"),
        (["n_train=2", "counts=1,2,3"], "3 segments but n_train=2"),
    ],
)
def test_cli_refuses_bad_values_naming_them(tmp_path, args, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        run(["dense", f"out={tmp_path / 'x'}", *args])
    assert not (tmp_path / "x").exists()


def test_cli_writes_reports_and_never_overwrites(tmp_path):
    env = {**os.environ, "COLUMNS": "60"}  # a narrow terminal must not wrap the summary
    out = tmp_path / "gen"
    cmd = [sys.executable, "-m", "libreyolo.cli.main", "data", "dense", f"out={out}", "n_train=6", "n_val=3"]
    r = subprocess.run([*cmd, "size=128", "counts=1,4,8"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    counts = _boxes_per_image(out, "train") + _boxes_per_image(out, "val")
    m = re.search(r"(\d+) boxes, objects per image min (\d+) mean ([\d.]+) max (\d+)", r.stdout)
    assert m and len(r.stdout.strip().splitlines()) == 1, r.stdout
    assert [int(m[1]), int(m[2]), int(m[4])] == [sum(counts), min(counts), max(counts)]
    assert float(m[3]) == pytest.approx(sum(counts) / len(counts), abs=0.05)
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 2 and "exists and is not empty" in again.stderr
