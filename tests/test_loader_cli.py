"""Loader settings, `libreyolo data prepare|shapes`, `libreyolo bench loader`, and cache= in a training run."""

import json
import os
import shutil
import subprocess
import sys

from conftest import FAST

from libreyolo.data import loader
from libreyolo.data.loader import default_workers, prefetch_factor, train_loader, val_loader


def _cli(*args):
    env = {**os.environ, "COLUMNS": "200"}  # rich tables are not wrapped, so lines can be matched
    return subprocess.run(
        [sys.executable, "-m", "libreyolo.cli.main", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_default_workers_follow_cpus_gpus_and_batch(monkeypatch):
    monkeypatch.setattr(loader, "cpu_count", lambda: 16)
    assert default_workers(64, 1) == 15  # one core stays with the training loop
    assert default_workers(64, 2) == 7
    assert default_workers(8, 1) == 8
    assert default_workers(64, 0) == 4  # CPU training keeps cores for compute
    monkeypatch.setattr(loader, "cpu_count", lambda: 128)
    assert default_workers(256, 1) == loader.MAX_WORKERS_PER_GPU
    monkeypatch.setattr(loader, "cpu_count", lambda: 2)
    assert default_workers(16, 1) == 1 and default_workers(16, 0) == 1
    assert [prefetch_factor(w) for w in (0, 1, 3, 4, 16)] == [None, 4, 4, 2, 2]


def test_train_workers_persist_and_val_workers_do_not(tiny_data):
    from libreyolo.data.config import list_images, load_data_config
    from libreyolo.data.dataset import YOLODataset
    from libreyolo.data.labels import scan_labels

    dc = load_data_config(tiny_data)
    ds = YOLODataset(scan_labels(list_images(dc.train), dc.nc), 64, True)
    tl, vl = train_loader(ds, 4, 2, seed=0, pin=False), val_loader(ds, 4, 2, pin=False)
    assert tl.persistent_workers and tl.prefetch_factor == 4 and not vl.persistent_workers
    assert train_loader(ds, 4, 0, seed=0, pin=False).num_workers == 0


def test_data_prepare_reports_each_bad_file_and_builds_caches(tiny_data, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(tiny_data.parent, root)
    labels = sorted((root / "labels" / "train").glob("*.txt"))
    labels[0].write_text("5 0.5 0.5 0.2 0.2\n")
    labels[1].write_text("0 0.5 0.5 0.2\n")
    (root / "images" / "val" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    r = _cli("data", "prepare", f"data={root / 'data.yaml'}", "imgsz=64", "cache=disk")
    assert r.returncode == 0, r.stderr
    bad_lines = [line for line in r.stderr.splitlines() if line.startswith("bad ")]
    assert len(bad_lines) == 3, r.stderr
    assert any("class 5 is out of range" in line and "train_00000" in line for line in bad_lines)
    assert any("expected 5 values" in line for line in bad_lines)
    assert any("broken.jpg" in line and "unreadable image" in line for line in bad_lines)
    assert "3 bad file(s)" in r.stdout and "14 new, 0 kept" in r.stdout and "8 new, 0 kept" in r.stdout
    assert (root / "labels" / "train.labels.npz").is_file() and (root / "labels" / "val.labels.npz").is_file()
    assert len(list((root / "images" / "train").glob("*.64.npy"))) == 14
    again = _cli("data", "prepare", f"data={root / 'data.yaml'}", "imgsz=64", "cache=disk")
    assert "0 new, 14 kept" in again.stdout
    refused = _cli("data", "prepare", f"data={root / 'data.yaml'}", "cache=ram")
    assert refused.returncode == 2 and "cache=ram lives only as long as a training run" in refused.stderr


def test_data_shapes_writes_a_dataset(tmp_path):
    out = tmp_path / "gen"
    r = _cli("data", "shapes", f"out={out}", "n_train=3", "n_val=2", "size=96")
    assert r.returncode == 0, r.stderr
    assert len(list((out / "images" / "train").glob("*.jpg"))) == 3 and (out / "data.yaml").is_file()
    again = _cli("data", "shapes", f"out={out}", "n_train=3", "n_val=2")
    assert again.returncode == 2 and "exists and is not empty" in again.stderr


def test_bench_loader_prints_json_and_a_table(tiny_data, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(tiny_data.parent, root)
    env_args = (f"data={root / 'data.yaml'}", "imgsz=64", "batch=4", "batches=2", "warmup=1")
    r = _cli("bench", "loader", *env_args, "workers=0,1", "cache=none,disk,ram", "json=true")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    rows = [(x["cache"], x["workers"]) for x in report["results"]]
    assert rows == [(c, w) for c in ("none", "disk", "ram") for w in (0, 1)]
    assert all(x["img_s"] > 0 and x["cpu_ms_per_img"] >= 0 and x["used"] == x["cache"] for x in report["results"])
    assert report["images"] == 16 and report["cpus"] >= 1
    t = _cli("bench", "loader", *env_args, "workers=0", "cache=ram")
    assert t.returncode == 0 and "img/s" in t.stdout and "ram" in t.stdout
    bad = _cli("bench", "loader", *env_args, "cache=tape")
    assert bad.returncode == 2 and "'tape' is not one of none, disk, ram" in bad.stderr


def test_training_setup_with_cache_ram_serves_both_splits_and_releases_them(tiny_data, tmp_path, monkeypatch):
    from libreyolo import LibreYOLO
    from libreyolo.config import TrainConfig
    from libreyolo.engine.setup import build_run

    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setenv("LIBREYOLO_SHM_DIR", str(shm))
    root = tmp_path / "ds"
    shutil.copytree(tiny_data.parent, root)

    def no_decode(*a):
        raise AssertionError("a cached image was decoded again")

    monkeypatch.setattr("libreyolo.data.dataset.load_resized", no_decode)  # workers=0: the loader runs here
    m = LibreYOLO("LibreYOLO9t")
    kw = {**FAST, "data": str(root / "data.yaml"), "project": str(tmp_path / "runs"), "epochs": 1, "cache": True}
    s = build_run(m, TrainConfig.from_overrides(kw, family=m.family), lambda e: None)
    try:
        assert s.train_loader.dataset.image_source.mode == "ram" and s.val_loader.dataset.image_source.mode == "ram"
        assert len(list(shm.glob("*.bin"))) == 2  # train and val
        assert next(iter(s.train_loader))["img"].shape == (8, 64, 64, 3)
        assert next(iter(s.val_loader))["img"].shape[1:] == (64, 64, 3)
    finally:
        s.close()  # what the trainer does when the run ends
    assert not list(shm.glob("*.bin"))


def test_fast_flip_and_hsv_give_the_reference_bytes():
    import cv2
    import numpy as np

    from libreyolo.data import augment as A

    img = np.random.default_rng(1).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    boxes = np.array([[0, 4, 6, 20, 30]], np.float32)
    out = A.flip(img, boxes.copy(), np.random.default_rng(0), 1.0, 1.0)
    assert np.array_equal(out, img[::-1, ::-1])
    # the split/LUT/merge formulation the 3-channel LUT replaced
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    got = img.copy()
    A.augment_hsv(got, rng_a, 0.015, 0.7, 0.4)
    r = rng_b.uniform(-1, 1, 3) * (0.015, 0.7, 0.4) + 1
    x = np.arange(256, dtype=np.float32)
    hue, sat, val = cv2.split(cv2.cvtColor(img, cv2.COLOR_RGB2HSV))
    luts = ((x * r[0]) % 180, np.clip(x * r[1], 0, 255), np.clip(x * r[2], 0, 255))
    hsv = cv2.merge([cv2.LUT(c, lut.astype(np.uint8)) for c, lut in zip((hue, sat, val), luts)])
    assert np.array_equal(got, cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB))
