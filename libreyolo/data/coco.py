"""COCO JSON datasets, read directly: `data=instances.json`, or a yaml whose train:/val: name COCO files.

Categories become contiguous class indices in the order of their ids, with their names; `iscrowd` boxes are left
out of training and kept apart for validation, which ignores detections on them as COCO's evaluation does. The
images are looked for where the common layouts put them: beside the JSON (Roboflow's COCO export:
train/_annotations.coco.json), the COCO 2017 layout (annotations/instances_train2017.json and train2017/), an
`images:` folder the yaml names, or images/ beside or above the JSON."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from libreyolo.errors import DataError


def is_coco_json(path: str | Path) -> bool:
    return str(path).lower().endswith(".json")


@dataclass
class CocoFile:
    path: Path
    names: list[str]
    category_index: dict[int, int]  # COCO category id -> class index
    images: list[dict[str, Any]]  # COCO image dicts
    annotations: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # image id -> its annotations


def read_coco(path: Path) -> CocoFile:
    """The JSON's categories, images and annotations, checked: a file that is not COCO detection JSON is an error
    naming the file and the key that is missing."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not a readable JSON file ({type(e).__name__}: {e})") from None
    if not isinstance(raw, dict) or not all(isinstance(raw.get(k), list) for k in ("images", "categories")):
        raise DataError(f"{path}: not COCO JSON: it needs lists 'images', 'annotations' and 'categories'")
    cats = sorted(raw["categories"], key=lambda c: int(c["id"]))
    if not cats:
        raise DataError(f"{path}: 'categories' is empty; a COCO dataset names its classes there")
    anns: dict[int, list[dict[str, Any]]] = {}
    for a in raw.get("annotations") or []:
        anns.setdefault(int(a["image_id"]), []).append(a)
    return CocoFile(
        path=path,
        names=[str(c.get("name", c["id"])) for c in cats],
        category_index={int(c["id"]): i for i, c in enumerate(cats)},
        images=list(raw["images"]),
        annotations=anns,
    )


def image_root(path: Path, file_names: list[str], hint: Path | None = None) -> Path:
    """The folder the JSON's file_name entries are relative to (the first where its first images exist)."""
    split = re.sub(r"^[a-z_]*?(instances|annotations)_?", "", path.stem, flags=re.I)  # instances_train2017 -> train2017
    candidates = [hint] if hint is not None else []
    candidates += [path.parent, path.parent.parent / split, path.parent / "images", path.parent.parent / "images"]
    candidates += [path.parent.parent / "images" / split, path.parent.parent]
    probe = file_names[:3]
    for c in dict.fromkeys(x for x in candidates if x is not None):
        if all((c / f).is_file() for f in probe):
            return c
    tried = ", ".join(str(c) for c in dict.fromkeys(x for x in candidates if x is not None))
    raise DataError(
        f"{path}: its images (first: {probe[0] if probe else '?'}) are in none of {tried}; name their folder with "
        "`images:` in a dataset yaml (train: this.json, images: FOLDER)"
    )


def coco_split(coco: CocoFile, root: Path) -> tuple[list[Path], list[np.ndarray], list[np.ndarray], list[str]]:
    """-> image files (sorted by path), per image its boxes (n, 5) class, cx, cy, w, h normalised to the width and
    height the JSON gives, per image its crowd boxes in the same form, and notes on annotations left out."""
    rows: list[tuple[Path, np.ndarray, np.ndarray]] = []
    dropped: list[str] = []
    for im in coco.images:
        w, h = float(im.get("width") or 0), float(im.get("height") or 0)
        boxes, crowd = [], []
        for a in coco.annotations.get(int(im["id"]), []):
            x, y, bw, bh = (float(v) for v in a.get("bbox", (0, 0, 0, 0)))
            c = coco.category_index.get(int(a.get("category_id", -1)))
            if c is None or bw <= 0 or bh <= 0 or w <= 0 or h <= 0:
                dropped.append(f"annotation {a.get('id')} of image {im.get('file_name')}")
                continue
            row = [c, (x + bw / 2) / w, (y + bh / 2) / h, bw / w, bh / h]
            (crowd if a.get("iscrowd") else boxes).append(row)
        rows.append((root / str(im["file_name"]), _finish(boxes), _finish(crowd)))
    rows.sort(key=lambda r: str(r[0]))
    notes = []
    if dropped:
        more = f" (and {len(dropped) - 3} more)" if len(dropped) > 3 else ""
        notes.append(
            f"{coco.path}: left out {len(dropped)} annotation(s) with an unknown category_id, an empty bbox or an "
            f"image without width/height: {', '.join(dropped[:3])}{more}"
        )
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], notes


def _finish(rows: list[list[float]]) -> np.ndarray:
    """As the .txt labels are kept (data/labels.py): float32, clipped to the image, duplicates once, sorted."""
    arr = np.array(rows, np.float32).reshape(-1, 5)
    arr[:, 1:] = arr[:, 1:].clip(0.0, 1.0)
    return np.unique(arr, axis=0) if len(arr) else arr


def val_sibling(path: Path) -> Path | None:
    """The validation JSON beside a training one, where the common layouts put it: train/_annotations.coco.json ->
    valid/ (or val/); instances_train2017.json -> instances_val2017.json."""
    if "train" in path.stem:
        for word in ("val", "valid"):
            p = path.with_name(path.name.replace("train", word))
            if p.is_file():
                return p
    if path.parent.name == "train":
        for word in ("valid", "val", "validation"):
            p = path.parent.parent / word / path.name
            if p.is_file():
                return p
    return None
