"""Classification datasets: an ImageFolder tree (`root/train/<class>/*.jpg`, `root/val/<class>/*.jpg`), a yaml
pointing at one, or the built-in shapes crops. Labels are the class folders' names. The scan yields the same
LabelSet the detection pipeline uses (each image one whole-image "box" of its class), so the image caches and
the loaders serve classification unchanged."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

from libreyolo.data.config import IMG_EXTS, DataConfig, is_builtin, walk_files
from libreyolo.data.labels import LabelSet, _stamp, displayed_size, truncated_jpeg
from libreyolo.data.shapes_cls import CLASSIFY_DEMO_SETTINGS, builtin_classify_root
from libreyolo.errors import DataError


def load_classify_config(data: str | os.PathLike[str]) -> DataConfig:
    """`shapes` (the built-in crops), an ImageFolder root holding train/ and val/ (or validation/), or a yaml with
    `path`, `train`, `val` naming such split folders (and optional `names`, which must match the folders)."""
    s = str(data)
    if is_builtin(s):
        cfg = _from_root(builtin_classify_root())
        cfg.suggested = dict(CLASSIFY_DEMO_SETTINGS)
        return cfg
    path = Path(s).expanduser()
    if path.is_dir():
        return _from_root(path)
    if not path.is_file():
        raise DataError(
            f"classification data {path} does not exist. Pass data=FOLDER (with train/<class>/ and val/<class>/), "
            "a yaml naming them, or data=shapes for the built-in crops."
        )
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise DataError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise DataError(f"{path}: expected a mapping with keys path, train, val")
    root = Path(raw.get("path") or path.parent).expanduser()
    root = root if root.is_absolute() else path.parent / root
    if "train" not in raw and "val" not in raw:
        return _from_root(root, path)
    splits = {}
    for key in ("train", "val"):
        value = raw.get(key) or (raw.get("validation") if key == "val" else None)
        if not value:
            raise DataError(f"{path}: key {key!r} is missing; it names a folder of class folders")
        folder = Path(str(value)).expanduser()
        splits[key] = folder if folder.is_absolute() else root / folder
    cfg = _config(path, root, splits["train"], splits["val"])
    given = raw.get("names")
    if given is not None:
        given = [str(given[k]) for k in sorted(given)] if isinstance(given, dict) else [str(n) for n in given]
        if given != cfg.names:
            raise DataError(f"{path}: names {given} do not match the class folders of {splits['train']}: {cfg.names}")
    return cfg


def _from_root(root: Path, yaml_path: Path | None = None) -> DataConfig:
    val = next((root / v for v in ("val", "validation") if (root / v).is_dir()), root / "val")
    return _config(yaml_path or root, root, root / "train", val)


def _config(where: Path, root: Path, train: Path, val: Path) -> DataConfig:
    for split, folder in (("train", train), ("val", val)):
        if not folder.is_dir():
            raise DataError(f"{where}: {split}: {folder} is not a folder (expected {folder}/<class>/<image>)")
    return DataConfig(yaml_path=where, root=root, names=class_folders(train), train=[train], val=[val])


def class_folders(split: Path) -> list[str]:
    """The class names of a split folder: its sub-folders, sorted. A file at class level is an error that names it
    (an image there has no class)."""
    entries = sorted(split.iterdir())
    stray = [p for p in entries if p.is_file() and not p.name.startswith(".")]
    if stray:
        more = f" (and {len(stray) - 1} more)" if len(stray) > 1 else ""
        raise DataError(
            f"{stray[0]}: a file at class level in {split}{more}; images go in {split}/<class>/, one folder per class"
        )
    names = [p.name for p in entries if p.is_dir() and not p.name.startswith(".")]
    if not names:
        raise DataError(f"{split} has no class folders (expected {split}/<class>/<image>)")
    return names


def scan_classes(split: Path, names: list[str], threads: int = 8) -> LabelSet:
    """Every image under split/<class>/ with its class index -> LabelSet (label rows: class, 0.5, 0.5, 1, 1).
    An empty class folder, or a class folder the training split does not have, is an error naming the folder;
    an unreadable image is skipped and reported by name in LabelSet.skipped (as the detection scan does)."""
    index = {n: i for i, n in enumerate(names)}
    files: list[Path] = []
    classes: list[int] = []
    for folder in sorted(p for p in split.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if folder.name not in index:
            raise DataError(f"{folder}: class folder {folder.name!r} is not among the training classes {names}")
        images = walk_files(folder, IMG_EXTS)  # linked folders inside included
        if not images:
            raise DataError(f"{folder}: empty class folder (no {'/'.join(IMG_EXTS)} image in it)")
        files += images
        classes += [index[folder.name]] * len(images)
    with ThreadPoolExecutor(threads) as pool:
        checked = list(pool.map(image_check, files))
    out = LabelSet([], [], [], stamps=[])
    for f, c, (shape, why) in zip(files, classes, checked, strict=True):
        if why is not None:
            out.skipped.append((str(f), why))
            continue
        out.files.append(f)
        out.labels.append(np.array([[c, 0.5, 0.5, 1.0, 1.0]], np.float32))
        out.shapes.append(shape)
        out.stamps.append(_stamp(f))
    return out


def image_check(image: Path) -> tuple[tuple[int, int], str | None]:
    """-> ((height, width) as displayed, None) or ((0, 0), why the image cannot be used)."""
    try:
        with Image.open(image) as im:
            w, h = displayed_size(im)
            jpeg = im.format == "JPEG"
            im.verify()
        why = truncated_jpeg(image) if jpeg else None
    except Exception as e:  # PIL raises many types for broken files
        return (0, 0), f"unreadable image ({type(e).__name__}: {e})"
    if why is None and (w < 2 or h < 2):
        why = f"image is {w}x{h} pixels"
    return (h, w), why
