"""Shared fixtures: a private cache folder, plain (non-TTY) rendering, and tiny synthetic datasets."""

from __future__ import annotations

import os
from pathlib import Path

# One intra-op thread per process: several tests run two or three processes at once (DDP ranks, a
# trainer beside the console), and OpenMP threads spinning against each other on 2 cores made steps
# 20-50x slower than single-threaded ones. Set before torch is imported; subprocesses inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def step_batches(cfg, n, device):
    """n different real training batches of the run cfg describes (its built-in dataset and augmentation), one per
    seed 0..n-1, on the device: fixed across runs. -> (batches, nc)."""
    from libreyolo.bench.step import _batch_on_device
    from libreyolo.config import TrainConfig

    out = []
    for k in range(n):
        data, nc = _batch_on_device(TrainConfig.from_overrides({**cfg.to_dict(), "seed": k}), cfg.batch, device)
        out.append(data)
    return out, nc


def step_trajectory(mode, cfg, batches, nc, device, events=None):
    """The losses of the step runner for `mode` (bench step's make_runner) over the batches, an optimizer step at
    each accumulation boundary. -> (losses (steps, terms), parts, runner)."""
    import torch

    from libreyolo.bench.step import make_runner

    step, parts = make_runner(cfg, device, nc, mode, (events.append if events is not None else None))
    losses = []
    for i, b in enumerate(batches):
        items = step(b["img"], b["targets"], b["mask"], (i + 1) % parts.accumulate == 0)
        losses.append(items.clone())
    torch.cuda.synchronize()
    return torch.stack(losses), parts, step


def run_start_event(**changes):
    """A valid run_start of a small CPU LibreYOLO9t run; tests pass only the fields their case is about."""
    from libreyolo import events as ev
    from libreyolo.families import get_family

    fields = dict(
        run_dir="runs/train/exp",
        model="LibreYOLO9t",
        family="yolo9",
        task="detect",
        nc=1,
        names=["a"],
        data="d.yaml",
        epochs=3,
        start_epoch=0,
        batch=8,
        batch_per_rank=8,
        accumulate=8,
        world_size=1,
        imgsz=64,
        device="cpu",
        amp=False,
        amp_dtype="float32",
        cuda_graph="auto",
        cuda_graph_mode="false",
        cuda_graph_reason="cuda_graph=auto: CUDA graphs need a CUDA device; training eager on cpu",
        loss_terms=list(get_family("yolo9").loss_terms),
        workers=0,
        optimizer="AdamW",
        steps_per_epoch=2,
        train_images=16,
        val_images=8,
        params=1,
        pid=1,
        resumed=False,
        config={},
    )
    return ev.RunStart(**{**fields, **changes})


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ["LIBREYOLO_CACHE"] = str(tmp_path_factory.mktemp("libreyolo-cache"))
    # cache=auto, the default, keeps images in RAM caches there, not in the host's /dev/shm
    os.environ["LIBREYOLO_SHM_DIR"] = str(tmp_path_factory.mktemp("libreyolo-shm"))
    os.environ["CI"] = os.environ.get("CI", "1")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 train / 8 val shapes images of 64 px: enough for a few real steps in seconds."""
    from libreyolo.data.shapes import make_shapes

    return make_shapes(tmp_path_factory.mktemp("tiny") / "shapes", n_train=16, n_val=8, size=64)


def repeated_shapes(root: Path, size: int, copies: int = 4) -> Path:
    """8 shapes images of `size` px under root; the yaml trains on `copies` copies of each per epoch and
    validates on the 8 originals."""
    import shutil

    from libreyolo.data.shapes import make_shapes

    make_shapes(root, n_train=8, n_val=1, size=size)
    for sub in ("images", "labels"):
        (root / sub / "rep").mkdir()
    for img in sorted((root / "images" / "train").glob("*.jpg")):
        for k in range(copies):
            shutil.copy(img, root / "images" / "rep" / f"{img.stem}_{k}.jpg")
            shutil.copy(root / "labels" / "train" / f"{img.stem}.txt", root / "labels" / "rep" / f"{img.stem}_{k}.txt")
    yaml_path = root / "repeated.yaml"
    yaml_path.write_text(f"path: {root}\ntrain: images/rep\nval: images/train\nnames: [circle, square, triangle]\n")
    return yaml_path


@pytest.fixture(scope="session")
def overfit_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 images of 96 px; training sees 4 copies of each per epoch (4 steps at batch 8), validation the 8 originals."""
    return repeated_shapes(tmp_path_factory.mktemp("overfit") / "shapes", size=96)


# settings that make a CPU run short and free of randomness that tests do not control
# plots off: drawing them costs ~1.2 s of each CPU run; tests/test_plots.py and the picture tests turn them on
FAST = dict(imgsz=64, batch=8, workers=0, warmup_epochs=0, device="cpu", val=True, plots=False)
# no augmentation at all: the over-fit tests train on the images as they are
NO_AUG = dict(mosaic=0, degrees=0, shear=0, scale=0, translate=0, fliplr=0, hsv_h=0, hsv_s=0, hsv_v=0)


def patch_task(monkeypatch, name: str, **changes):
    """Run this test with the task's implementation changed (a dataset class, a validation wrapped): the task's
    TaskImpl with `changes`, until the test ends. -> the original implementation."""
    import dataclasses

    import libreyolo.tasks as tasks

    real = tasks.get_task(name).implementation()
    monkeypatch.setitem(tasks._IMPLS, name, dataclasses.replace(real, **changes))
    return real
