"""The training setup's data splits: scanned, with what was skipped as notes and a clear error when none is usable."""

from __future__ import annotations

from libreyolo.data.config import DataConfig, list_images
from libreyolo.data.folders import scan_classes
from libreyolo.data.labels import LabelSet, no_boxes_message, scan_labels, scan_notes
from libreyolo.errors import DataError


def scan_split(data: DataConfig, split: str, nc: int, notes: list[str], allow_empty: bool = False) -> LabelSet:
    """A detection split's images and labels, scanned (and cached); what was skipped becomes notes. Raises DataError
    naming the yaml and split when nothing usable is left, or when training would see no boxes at all (unless
    allow_empty)."""
    sources = getattr(data, split)
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
