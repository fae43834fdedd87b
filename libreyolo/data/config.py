"""Dataset yaml: `path`, `train`, `val`, optional `test`, `names` (list or dict), optional `nc`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from libreyolo.data.coco import is_coco_json, read_coco, val_sibling
from libreyolo.data.shapes import DEMO_SETTINGS, builtin_shapes_yaml
from libreyolo.errors import DataError

IMG_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


@dataclass
class DataConfig:
    yaml_path: Path
    root: Path
    names: list[str]
    train: list[Path]
    val: list[Path]
    test: list[Path] = field(default_factory=list)
    # training defaults a built-in dataset suggests (applied only to keys the user did not set)
    suggested: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # how the yaml was read, where that is worth a line
    coco_images: dict[str, Path | None] = field(default_factory=dict)  # a COCO JSON split -> its `images:` folder

    @property
    def nc(self) -> int:
        return len(self.names)


def is_builtin(data: str | os.PathLike) -> bool:
    """`shapes`, or `shapes.yaml` when no such file exists, names the built-in dataset."""
    return str(data) in ("shapes", "shapes.yaml") and not Path(data).is_file()


def load_data_config(data: str | os.PathLike) -> DataConfig:
    """Read and check a dataset yaml; `shapes` (or `shapes.yaml` absent on disk) is the built-in dataset."""
    s = str(data)
    if is_builtin(s):
        cfg = load_data_config(builtin_shapes_yaml())
        cfg.suggested = dict(DEMO_SETTINGS)
        return cfg
    path = Path(s).expanduser()
    if not path.is_file():
        raise DataError(
            f"dataset yaml {path} does not exist. Pass data=PATH/TO/dataset.yaml, or data=shapes for the built-in "
            "dataset."
        )
    if is_coco_json(path):
        return coco_config(path)
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise DataError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise DataError(f"{path}: expected a mapping with keys path, train, val, names")
    root = Path(raw.get("path") or path.parent).expanduser()
    if not root.is_absolute():
        # relative `path` is relative to the yaml's folder (then to the working directory, as Ultralytics does)
        root = (path.parent / root) if (path.parent / root).exists() else root.resolve()
    if any(is_coco_json(str(raw.get(k) or "")) for k in ("train", "val")):
        return _coco_from_yaml(raw, root, path)
    names = _names(raw, path)
    if not raw.get("val") and raw.get("validation"):  # some exporters write `validation:`
        raw["val"] = raw["validation"]
    for key in ("train", "val"):
        if not raw.get(key):
            alias = " (nor its alias 'validation')" if key == "val" else ""
            raise DataError(
                f"{path}: key {key!r} is missing{alias}; it names a folder of images, a .txt list of images, "
                "or a list of either"
            )
    notes: list[str] = []
    splits = {k: _sources(raw[k], root, path, k, notes) if raw.get(k) else [] for k in ("train", "val", "test")}
    return DataConfig(yaml_path=path, root=root, names=names, notes=notes, **splits)


def coco_config(
    train: Path, val: Path | None = None, images: Path | None = None, yaml_path: Path | None = None
) -> DataConfig:
    """A COCO JSON dataset (data/coco.py): names from the training JSON's categories; the validation JSON is the
    one given, else the one the layout puts beside it, else the training JSON itself (with a note)."""
    coco = read_coco(train)
    notes: list[str] = []
    if val is None:
        val = val_sibling(train)
        if val is None:
            val = train
            notes.append(f"{train}: no validation JSON found beside it; validating on the training images")
    if val != train and read_coco(val).names != coco.names:
        raise DataError(f"{val}: its categories {read_coco(val).names} differ from {train}'s {coco.names}")
    return DataConfig(
        yaml_path=yaml_path or train,
        root=train.parent,
        names=coco.names,
        train=[train],
        val=[val],
        notes=notes,
        coco_images={str(train): images, str(val): images},
    )


def _coco_from_yaml(raw: dict, root: Path, path: Path) -> DataConfig:
    """A yaml whose train:/val: name COCO JSON files (and optional images: their folder; names, if given, must be
    the categories')."""
    got = {}
    for key in ("train", "val", "images"):
        value = raw.get(key) or (raw.get("validation") if key == "val" else None)
        if value is None:
            continue
        p = Path(str(value)).expanduser()
        p = p if p.is_absolute() else root / p
        if not p.exists():
            raise DataError(f"{path}: {key}: {value} does not exist (relative paths are relative to 'path', {root})")
        got[key] = p
    if "train" not in got or not is_coco_json(got["train"]):
        raise DataError(f"{path}: train: must name a COCO JSON file when val: does (or neither does)")
    cfg = coco_config(got["train"], got.get("val"), got.get("images"), path)
    if raw.get("names") is not None and _names(raw, path) != cfg.names:
        raise DataError(f"{path}: names {_names(raw, path)} differ from the COCO categories {cfg.names}; drop names:")
    return cfg


def _names(raw: dict, path: Path) -> list[str]:
    names = raw.get("names")
    nc = raw.get("nc")
    if names is None:
        if isinstance(nc, int) and nc > 0:
            return [f"class{i}" for i in range(nc)]
        raise DataError(f"{path}: key 'names' is missing (a list of class names, or a dict {{0: name, ...}})")
    if isinstance(names, dict):
        try:
            keys = sorted(int(k) for k in names)
        except (TypeError, ValueError):
            raise DataError(f"{path}: 'names' keys must be class indices 0..N-1") from None
        if keys != list(range(len(keys))):
            raise DataError(f"{path}: 'names' keys must be 0..{len(keys) - 1} without gaps, got {keys}")
        names = [str(names[k] if k in names else names[str(k)]) for k in keys]
    elif isinstance(names, list):
        names = [str(n) for n in names]
    else:
        raise DataError(f"{path}: 'names' must be a list or a dict, got {type(names).__name__}")
    if not names:
        raise DataError(f"{path}: 'names' is empty")
    if nc is not None and nc != len(names):
        raise DataError(f"{path}: nc={nc} but 'names' has {len(names)} entries; make them agree (or drop nc)")
    return names


def _sources(value: Any, root: Path, path: Path, key: str, notes: list[str]) -> list[Path]:
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        text = str(item)
        p = Path(text).expanduser()
        if p.is_absolute():
            if not p.exists():
                raise DataError(f"{path}: {key}: {p} does not exist")
            out.append(p)
            continue
        p = root / p
        # Roboflow's export writes `train: ../train/images` beside a yaml in the dataset's root: as Ultralytics
        # does, a path that does not exist as written is tried without its leading ../ (from path:, then from the
        # yaml's folder)
        bare = text.replace("\\", "/")
        tried = [p]
        if not p.exists() and bare.startswith("../"):
            for alt in dict.fromkeys((root / bare[3:], path.parent / bare[3:])):
                tried.append(alt)
                if alt.exists():
                    notes.append(f"{path}: {key}: {text} does not exist; using {alt.resolve()} (without the ../)")
                    p = alt
                    break
        if not p.exists():
            raise DataError(
                f"{path}: {key}: {text} does not exist (tried {' and '.join(map(str, tried))}; relative paths are "
                f"relative to 'path', here {root})"
            )
        out.append(p)
    return out


def list_images(sources: list[Path]) -> list[Path]:
    """Image files of folders (recursive, through directory links: walk_files) and .txt lists, sorted for a stable
    order. A path listed twice in .txt lists (or two sources holding the same file) stays twice: oversampling, as in
    Ultralytics. In a .txt list, blank lines and lines starting with # are not paths; a UTF-8 byte order mark is
    not part of the first path."""
    files: list[Path] = []
    for src in sources:
        if src.is_dir():
            files.extend(walk_files(src, IMG_EXTS))
        elif src.suffix == ".txt":
            base = src.parent
            for line in src.read_text(encoding="utf-8-sig").splitlines():
                line = line.strip()
                if line and not line.startswith("#"):
                    p = Path(line)
                    files.append(p if p.is_absolute() else (base / p))
        elif src.suffix.lower() in IMG_EXTS:
            files.append(src)
    return sorted(files)


def walk_files(folder: Path, exts: tuple[str, ...]) -> list[Path]:
    """Files under folder with one of these suffixes (any case), sorted; directory links are followed (Path.rglob
    does not follow them in Python 3.11: a linked folder of images was skipped without a word). A link back into a
    folder already being walked (a loop) is not followed again; each file appears once per path to it."""
    out: list[Path] = []
    seen: set[tuple[int, int]] = set()
    for root, dirs, names in os.walk(folder, followlinks=True):
        st = os.stat(root)
        if (st.st_dev, st.st_ino) in seen:  # reached again through a link: a loop, or a second link to it
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        out.extend(Path(root, n) for n in names if os.path.splitext(n)[1].lower() in exts)
    return sorted(out)


def label_path(image: Path) -> Path:
    """YOLO convention: .../images/.../x.jpg -> .../labels/.../x.txt (else beside the image)."""
    parts = list(image.parts)
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == "images":
            parts[i] = "labels"
            return Path(*parts).with_suffix(".txt")
    return image.with_suffix(".txt")
