"""The built-in dataset: deterministic synthetic shapes (circle, square, triangle) in YOLO format.

Generated once into the user cache folder (LIBREYOLO_CACHE, else $XDG_CACHE_HOME/libreyolo, else
~/.cache/libreyolo); a folder is only used once it is complete (built aside, then renamed)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

NAMES = ["circle", "square", "triangle"]
VERSION = 1

# What `libreyolo train` with no arguments uses (each applies only where the user did not set the key):
# small enough to finish in minutes on 2 CPU cores while visibly learning.
DEMO_SIZE = dict(n_train=320, n_val=64, size=160)
DEMO_SETTINGS = {"imgsz": 128, "epochs": 30, "batch": 16, "no_aug_epochs": 5, "warmup_epochs": 1.0}


def cache_root() -> Path:
    env = os.environ.get("LIBREYOLO_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "libreyolo"


def builtin_shapes_yaml(
    n_train: int = DEMO_SIZE["n_train"], n_val: int = DEMO_SIZE["n_val"], size: int = DEMO_SIZE["size"]
) -> Path:
    """Path of the built-in dataset's yaml, generating the dataset first if needed."""
    root = cache_root() / "datasets" / f"shapes-v{VERSION}-{n_train}-{n_val}-{size}"
    if not (root / "data.yaml").is_file():
        make_shapes(root, n_train, n_val, size)
    return root / "data.yaml"


def make_shapes(out: str | os.PathLike, n_train: int, n_val: int, size: int, seed: int = 0, quality: int = 90) -> Path:
    """Write images/{train,val}, labels/{train,val} and data.yaml under `out`; returns the yaml path."""
    import cv2  # here, not at import: the console reads this module's settings and never draws
    import numpy as np

    out = Path(out)
    tmp = out.with_name(out.name + f".partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for split, n, split_seed in (("train", n_train, seed), ("val", n_val, seed + 1_000_003)):
        (tmp / "images" / split).mkdir(parents=True)
        (tmp / "labels" / split).mkdir(parents=True)
        rng = np.random.default_rng(split_seed)
        for i in range(n):
            img, rows = _draw(rng, size)
            stem = f"{split}_{i:05d}"
            cv2.imwrite(str(tmp / "images" / split / f"{stem}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, quality])
            (tmp / "labels" / split / f"{stem}.txt").write_text(
                "".join(f"{c} {x:.6f} {y:.6f} {w:.6f} {h:.6f}\n" for c, x, y, w, h in rows)
            )
    names = "".join(f"  {i}: {n}\n" for i, n in enumerate(NAMES))
    (tmp / "data.yaml").write_text(
        f"# libreyolo built-in synthetic dataset (v{VERSION})\npath: .\ntrain: images/train\nval: "
        f"images/val\nnames:\n{names}"
    )
    move_into_place(tmp, out)
    return out / "data.yaml"


def move_into_place(tmp: Path, out: Path) -> None:
    """A dataset folder built aside (`tmp`) becomes `out` in one rename, so a folder is only ever seen complete;
    where another process finished first, its folder stays and this one is removed."""
    if out.exists():
        shutil.rmtree(tmp, ignore_errors=True)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, out)
    except OSError:  # the other process renamed its folder into place in between
        shutil.rmtree(tmp, ignore_errors=True)


def _draw(rng: np.random.Generator, size: int) -> tuple[np.ndarray, list[tuple]]:
    import cv2
    import numpy as np

    h = int(size * rng.uniform(0.75, 1.0))
    w = size
    if rng.random() < 0.5:
        h, w = w, h
    # smooth two-colour gradient background with sensor-like noise
    c0, c1 = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    t = np.linspace(0, 1, w, dtype=np.float32)[None, :, None]
    img = (c0 * (1 - t) + c1 * t).repeat(h, 0)
    img = np.clip(img + rng.normal(0, 8, img.shape), 0, 255).astype(np.uint8)
    rows, placed = [], []
    for _ in range(int(rng.integers(1, 5))):
        cls = int(rng.integers(0, len(NAMES)))
        s = rng.uniform(0.16, 0.42) * min(h, w)
        for _try in range(10):  # keep shapes mostly unoccluded so every label is visible
            cx, cy = rng.uniform(s / 2, w - s / 2), rng.uniform(s / 2, h - s / 2)
            if all(abs(cx - px) > (s + ps) * 0.4 or abs(cy - py) > (s + ps) * 0.4 for px, py, ps in placed):
                break
        else:
            continue
        placed.append((cx, cy, s))
        color = tuple(int(v) for v in rng.integers(0, 256, 3))
        if np.abs(np.array(color) - img[int(cy), int(cx)].astype(int)).sum() < 120:
            color = tuple(255 - v for v in color)
        if cls == 0:
            cv2.circle(img, (int(cx), int(cy)), int(s / 2), color, -1, cv2.LINE_AA)
            box = (cx - s / 2, cy - s / 2, cx + s / 2, cy + s / 2)
        elif cls == 1:
            cv2.rectangle(img, (int(cx - s / 2), int(cy - s / 2)), (int(cx + s / 2), int(cy + s / 2)), color, -1)
            box = (int(cx - s / 2), int(cy - s / 2), int(cx + s / 2) + 1, int(cy + s / 2) + 1)
        else:
            pts = np.array([[cx, cy - s / 2], [cx - s / 2, cy + s / 2], [cx + s / 2, cy + s / 2]], np.int32)
            cv2.fillPoly(img, [pts], color, cv2.LINE_AA)
            box = (pts[:, 0].min(), pts[:, 1].min(), pts[:, 0].max() + 1, pts[:, 1].max() + 1)
        x1, y1, x2, y2 = (float(v) for v in box)
        x1, y1, x2, y2 = max(x1, 0), max(y1, 0), min(x2, w), min(y2, h)
        rows.append((cls, (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h))
    return img, rows
