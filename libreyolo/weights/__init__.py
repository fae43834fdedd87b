"""Weights from files: this project's checkpoints and the foreign ones its families' converters read (LibreYOLO 1.6,
official releases, torchvision), found by their content, never by their name. Nothing here knows a family: each
family lists its converters (`Family.convert`). Nothing is downloaded, and nothing in a file runs as code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from libreyolo.engine.checkpoint import FORMAT, load_checkpoint
from libreyolo.errors import CheckpointError
from libreyolo.families import Family, families, parse_model_name
from libreyolo.families.base import Converter, Foreign
from libreyolo.weights.read import read_file

SUFFIXES = (".pt", ".pth", ".safetensors")  # what a model= or pretrained= value ending so names: a file


def known_formats() -> str:
    """The formats a file may be in, for errors that name them."""
    names = [f"libreyolo checkpoint ({FORMAT}: a run's weights/best.pt or last.pt)"]
    names += [c.format for fam in families().values() for c in fam.converters()]
    return "; ".join(dict.fromkeys(names))


def missing(path: Path) -> CheckpointError:
    """The error for a weights path with no file: nothing is downloaded, so it says where such files are published
    and how to pass one."""
    parsed = parse_model_name(path.stem)
    fams = [parsed[0]] if parsed else [f for f in families().values() if f.published]
    where = " ".join(f"{f.published}." for f in fams if f.published)
    build = f" pretrained=false or model={path.stem} builds an untrained {path.stem};" if parsed else ""
    return CheckpointError(
        f"{path} does not exist.{build} nothing is downloaded, ever. {where} Download one where there is a network "
        "and pass its path: LibreYOLO('path/to/file.pt'), model=path/to/file.pt, or pretrained=path/to/file.pt to "
        "start a training of a model (of any class count) from it."
    )


def find(
    tensors: dict[str, Any], meta: dict[str, Any], family: Family | None = None
) -> tuple[Family, Converter, Foreign]:
    """The family and converter that read these tensors, and what they read; `family` first (pretrained= of a model
    of that family), then every family in registry order. Partial weights (a backbone) come only for `family`. A
    converter's refusal (CheckpointError: a file of its format it cannot load) is raised only when no other reads the
    file: RT-DETR's and D-FINE's official layouts share their decoder's names."""
    fams = list(families().values())
    if family is not None:
        fams = [family] + [f for f in fams if f is not family]
    refused: CheckpointError | None = None
    for fam in fams:
        for conv in fam.converters():
            try:
                got = conv.read(tensors, meta)
            except CheckpointError as e:  # a format it knows but cannot load: another family's may still read it
                refused = refused or e
                continue
            if got is not None and (not got.partial or fam is family):
                return fam, conv, got
    if refused is not None:
        raise refused
    raise LookupError


def load(path: str | Path, family: Family | None = None) -> dict[str, Any]:
    """A weights file -> a checkpoint record as this project writes them (family, size, names, model: the
    weights in the family's layout, imgsz), plus "note": the one line saying what was read (empty for this
    project's own checkpoints). family: the model's family where the file starts a training of it (pretrained=)."""
    path = Path(path)
    if not path.is_file():
        raise missing(path)
    if path.suffix != ".safetensors":
        try:
            return {**load_checkpoint(path), "note": ""}
        except CheckpointError:
            pass  # not this project's: read below, whose error names every known format
    known = known_formats()
    tensors, meta = read_file(path, known)
    try:
        fam, conv, got = find(tensors, meta, family)
    except LookupError:
        raise CheckpointError(f"{path} is a weights file of no known format. Known formats: {known}") from None
    except CheckpointError as e:  # a converter's format, of a network it cannot build: the reason, with the file
        raise CheckpointError(f"{path}: {e}") from None
    names = got.names or [f"class{i}" for i in range(got.nc)]
    what = f"{fam.prefix}{got.size}" + (" (part)" if got.partial else f", {got.nc} classes")
    note = f"read {path}: {conv.format}, {what}, {len(got.state)} tensors"
    record = {"family": fam.name, "size": got.size, "names": names, "model": got.state, "note": note}
    record["imgsz"] = got.imgsz or 640
    record["partial"] = got.partial
    return record


def write(family: Family, size: str, state: dict[str, Any], format_prefix: str) -> dict[str, Any]:
    """The family's own weights in the layout of its converter whose format starts with format_prefix."""
    for conv in family.converters():
        if conv.format.startswith(format_prefix) and conv.write is not None:
            return dict(conv.write(state, size))
    raise CheckpointError(f"{family.name} has no converter writing {format_prefix!r}")
