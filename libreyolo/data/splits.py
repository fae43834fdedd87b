"""The training setup's data splits: scanned, with what was skipped as notes and a clear error when none is usable."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from libreyolo.atomic import written_whole
from libreyolo.data.coco import coco_split, image_root, is_coco_json, read_coco
from libreyolo.data.config import DataConfig, list_images
from libreyolo.data.folders import image_check, scan_classes
from libreyolo.data.labels import CACHE_VERSION, LabelSet, _stamp, no_boxes_message, scan_labels, scan_notes
from libreyolo.data.shapes import cache_root
from libreyolo.errors import DataError


def scan_split(data: DataConfig, split: str, nc: int, notes: list[str], allow_empty: bool = False) -> LabelSet:
    """A detection split's images and labels, scanned (and cached); what was skipped becomes notes. Raises DataError
    naming the yaml and split when nothing usable is left, or when training would see no boxes at all (unless
    allow_empty)."""
    sources = getattr(data, split)
    if len(sources) == 1 and is_coco_json(sources[0]):
        return scan_coco(data, split, sources[0], notes)
    images = list_images(sources)
    if not images:
        raise DataError(f"{data.yaml_path}: {split}: no images found in {', '.join(map(str, sources))}")
    ls = scan_labels(images, nc)
    notes += scan_notes(ls, split)
    if not len(ls):
        raise DataError(
            f"{data.yaml_path}: {split}: none of the {len(images)} images is usable ({len(ls.skipped)} skipped; first: "
            f"{ls.skipped[0][1]})"
        )
    empty = no_boxes_message(ls, split, data.yaml_path)
    if empty and split == "train" and not allow_empty:
        raise DataError(
            f"{empty} Training would learn nothing; if only background images are intended, set allow_empty=true."
        )
    if empty:
        notes.append(f"{empty} {'Validation mAP will be 0.' if split == 'val' else ''}".strip())
    return ls


def scan_coco(data: DataConfig, split: str, path: Path, notes: list[str]) -> LabelSet:
    """A COCO JSON split (data/coco.py): its images checked as the .txt scan checks them (an unreadable or truncated
    one skipped and named; the checks cached in JSON.scan.npz beside it, or in the user cache, until the JSON or an
    image changes), its boxes from the JSON, crowd boxes kept apart (LabelSet.crowd)."""
    coco = read_coco(path)
    if coco.names != data.names:
        raise DataError(f"{path}: its categories {coco.names} differ from the dataset's names {data.names}")
    root = image_root(path, [str(im["file_name"]) for im in coco.images], data.coco_images.get(str(path)))
    files, labels, crowd, dropped = coco_split(coco, root)
    notes += dropped
    if not files:
        raise DataError(f"{data.yaml_path}: {split}: {path} lists no images")
    stamps = [_stamp(f) for f in files]
    key = hashlib.sha256(repr((CACHE_VERSION, str(path), _stamp(path), [str(f) for f in files], stamps)).encode())
    cache = path.with_name(path.name + ".scan.npz")
    cache = cache if os.access(path.parent, os.W_OK) else cache_root() / "labels" / f"{key.hexdigest()[:16]}.scan.npz"
    checked = _load_checks(cache, key.hexdigest(), len(files))
    if checked is None:
        with ThreadPoolExecutor(8) as pool:
            checked = list(pool.map(image_check, files))
        _save_checks(cache, key.hexdigest(), checked)
    out = LabelSet([], [], [], stamps=[], crowd=[])
    for f, stamp, lab, cr, (shape, why) in zip(files, stamps, labels, crowd, checked, strict=True):
        if why is not None:
            out.skipped.append((str(f), why))
            continue
        out.files.append(f)
        out.labels.append(lab)
        out.crowd.append(cr)
        out.shapes.append(shape)
        out.stamps.append(stamp)
        out.backgrounds += len(lab) == 0
    notes += scan_notes(out, split)
    if not len(out):
        raise DataError(f"{data.yaml_path}: {split}: none of the {len(files)} images of {path} is usable")
    return out


def _load_checks(path: Path, key: str, n: int) -> list[tuple[tuple[int, int], str | None]] | None:
    """The image checks of an earlier scan of the same JSON and images (what the .txt scan's label cache keeps)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["key"]) != key or len(z["shapes"]) != n:
                return None
            return [((int(h), int(w)), why or None) for (h, w), why in zip(z["shapes"], z["why"].tolist())]
    except (OSError, KeyError, ValueError):
        return None


def _save_checks(path: Path, key: str, checked: list[tuple[tuple[int, int], str | None]]) -> None:
    shapes = np.array([s for s, _ in checked], np.int64).reshape(-1, 2)
    try:
        with written_whole(path) as tmp:  # its name keeps .npz, which np.savez would otherwise append
            np.savez(tmp, key=np.array(key), shapes=shapes, why=np.array([w or "" for _, w in checked]))
    except OSError:
        pass  # a cache is an optimisation; a read-only or full disk must not stop training


def scan_class_split(data: DataConfig, split: str, notes: list[str]) -> LabelSet:
    """A classification split: the images of its class folders (data/folders.py)."""
    ls = scan_classes(getattr(data, split)[0], data.names)
    notes += scan_notes(ls, split)
    if not len(ls):
        raise DataError(
            f"{data.yaml_path}: {split}: none of the {len(ls.skipped)} images is usable (first: {ls.skipped[0][0]}: "
            f"{ls.skipped[0][1]})"
        )
    return ls
