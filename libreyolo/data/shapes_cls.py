"""The built-in classification dataset: the detection demo's synthetic scenes (data/shapes.py), each shape cut
out with a margin and filed under its class folder (circle/, square/, triangle/) as a small square JPEG.

Generated once into the user cache folder, like the detection demo (built aside, then renamed)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import cv2
import numpy as np

from libreyolo.data.shapes import NAMES, _draw, cache_root, move_into_place

VERSION = 1
CLASSIFY_DEMO_SIZE = dict(n_train=480, n_val=96, size=64)
# what `libreyolo train model=LibreResNet18` with no data uses (where the user did not set the key): a couple of
# minutes on 2 CPU cores, visibly learning
CLASSIFY_DEMO_SETTINGS = {"imgsz": 64, "epochs": 10, "batch": 32, "scale": 0.5}


def builtin_classify_root(
    n_train: int = CLASSIFY_DEMO_SIZE["n_train"],
    n_val: int = CLASSIFY_DEMO_SIZE["n_val"],
    size: int = CLASSIFY_DEMO_SIZE["size"],
) -> Path:
    """The built-in crops' root (train/<class>/, val/<class>/), generating them first if needed."""
    root = cache_root() / "datasets" / f"shapes-cls-v{VERSION}-{n_train}-{n_val}-{size}"
    if not (root / "val").is_dir():
        make_shapes_classify(root, n_train, n_val, size)
    return root


def make_shapes_classify(out: str | os.PathLike[str], n_train: int, n_val: int, size: int, seed: int = 0) -> Path:
    """Write train/<class>/*.jpg and val/<class>/*.jpg under `out`: n crops per split, each a shape of a synthetic
    scene with a quarter of its size as margin, resized to size x size."""
    out = Path(out)
    tmp = out.with_name(out.name + f".partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for split, n, split_seed in (("train", n_train, seed), ("val", n_val, seed + 1_000_003)):
        for name in NAMES:
            (tmp / split / name).mkdir(parents=True)
        rng = np.random.default_rng(split_seed)
        made = 0
        while made < n:
            scene, rows = _draw(rng, 2 * size)
            h, w = scene.shape[:2]
            for c, cx, cy, bw, bh in rows:
                if made == n:
                    break
                side = max(bw * w, bh * h) * 1.5
                x1, y1 = int(max(cx * w - side / 2, 0)), int(max(cy * h - side / 2, 0))
                crop = scene[y1 : int(min(y1 + side, h)), x1 : int(min(x1 + side, w))]
                crop = cv2.resize(crop, (size, size), interpolation=cv2.INTER_AREA)
                path = tmp / split / NAMES[int(c)] / f"{split}_{made:05d}.jpg"
                cv2.imwrite(str(path), cv2.cvtColor(crop, cv2.COLOR_RGB2BGR))
                made += 1
    move_into_place(tmp, out)
    return out
