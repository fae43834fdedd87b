"""libreyolo data prepare|shapes|dense ...: the offline dataset steps."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from libreyolo.cli.args import parse_kv
from libreyolo.errors import ConfigError

USAGE = """usage: libreyolo data prepare data=my.yaml [imgsz=640] [cache=disk] [threads=N]
       libreyolo data shapes out=DIR [n_train=2000] [n_val=200] [size=640] [seed=0]
       libreyolo data dense out=DIR [n_train=800] [n_val=200] [size=640] [seed=0] [objects=2-24 | counts=2,40,150]
                            [classes=10]

  prepare  verify every image and label of every split (each bad file is named with its reason), build the
           label cache and, with cache=disk, the decoded-image cache, so training starts at once and never
           meets a bad file mid-epoch
  shapes   write the built-in synthetic dataset (circles, squares, triangles; JPEG + YOLO labels) to DIR
  dense    write a hard synthetic dataset to DIR: up to 10 shape classes, many objects per image (objects=LO-HI
           drawn per image, or counts=A,B,C: consecutive segments of the train split with about A, B, C objects
           per image), tiny to large, occluding each other, on textured backgrounds with unlabelled clutter"""


def run(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    sub, rest = argv[0], argv[1:]
    if any(a in ("-h", "--help") for a in rest):
        print(USAGE)
        return 0
    if sub == "prepare":
        kw = parse_kv(rest, {"data", "imgsz", "cache"}, {"threads": int})
        return prepare(**kw)
    if sub == "shapes":
        kw = parse_kv(rest, {"seed"}, {"out": str, "n_train": int, "n_val": int, "size": int})
        return shapes(**kw)
    if sub == "dense":
        kw = parse_kv(
            rest,
            {"seed"},
            {
                "out": str,
                "n_train": int,
                "n_val": int,
                "size": int,
                "objects": _count_range,
                "counts": _count_list,
                "classes": int,
            },
            command="data",
        )
        return dense(**kw)
    raise ConfigError(f"unknown data command {sub!r}; available: prepare, shapes, dense")


def prepare(data: str = "shapes", imgsz: int = 640, cache: bool | str = False, threads: int | None = None) -> int:
    from libreyolo.data.cache import estimate_bytes, fmt_bytes, open_image_cache
    from libreyolo.data.config import list_images, load_data_config
    from libreyolo.data.decode import decode_all
    from libreyolo.data.labels import cache_path_for, no_boxes_message, scan_labels, scan_notes

    if cache not in (False, "disk"):
        raise ConfigError(
            f"cache={'ram' if cache is True else cache} lives only as long as a training run; `data prepare` builds "
            "cache=disk (or none)"
        )
    out, err = Console(highlight=False, soft_wrap=True), Console(stderr=True, highlight=False, soft_wrap=True)
    dc = load_data_config(data)
    for note in dc.notes:
        err.print(f"[yellow]note:[/] {escape(note)}")
    table = Table(title=f"{dc.yaml_path} at imgsz {imgsz}")
    for col in ("split", "images", "usable", "bad", "background", "boxes", "decoded", "disk cache"):
        table.add_column(col, justify="left" if col in ("split", "disk cache") else "right")
    n_bad = n_lines = 0
    for split in ("train", "val", "test"):
        sources = getattr(dc, split)
        if not sources:
            continue
        images = list_images(sources)
        if not images:
            err.print(f"[red]{split}:[/] no images in {escape(', '.join(map(str, sources)))}")
            n_bad += 1
            continue
        ls = scan_labels(images, dc.nc, threads=threads or 8)
        bad = list(ls.skipped)
        notes = scan_notes(ls, split, skipped=False)  # skipped images are listed below as bad
        empty = no_boxes_message(ls, split, dc.yaml_path)
        if empty:
            notes.append(empty + (" Training refuses it unless allow_empty=true." if split == "train" else ""))
        size = estimate_bytes(ls.shapes, imgsz)
        if cache:
            src = open_image_cache("disk", ls, imgsz, split, notes, threads=threads, note_bad=False)
            bad += [] if src is None else src.bad
            where = "none (see above)" if src is None else f"{src.written} new, {src.reused} kept"
        else:
            # the label scan only reads headers; decoding every image is what training will do
            bad += decode_all(
                [str(f) for f in ls.files],
                [max(s) for s in ls.shapes],
                imgsz,
                lambda i, img: None,
                f"decoding {split} images",
                threads,
            )
            where = "-"
        for note in notes:
            err.print(f"[yellow]warning:[/] {escape(note)}")
        for f, why in bad:
            err.print(f"[red]bad[/] {escape(f)}: {escape(why)}")
        n_bad += len(bad)
        n_lines += len(ls.bad_lines)
        boxes = sum(len(x) for x in ls.labels)
        table.add_row(
            split,
            str(len(images)),
            str(len(images) - len(bad)),
            str(len(bad)),
            str(ls.backgrounds),
            str(boxes),
            fmt_bytes(size),
            where,
        )
        out.print(f"{split}: label cache {escape(str(cache_path_for(images)))}")
    out.print(table)
    lines = f"{n_lines} bad label line(s) (warnings above) are dropped; the rest of their files is used."
    if n_bad:
        out.print(f"{n_bad} bad file(s); they are skipped in training." + (f" {lines}" if n_lines else ""))
    else:
        out.print(lines if n_lines else "every image and label is usable.")
    return 0


def shapes(out: str | None = None, n_train: int = 2000, n_val: int = 200, size: int = 640, seed: int = 0) -> int:
    from libreyolo.data.shapes import make_shapes

    path = _new_folder("shapes", out, n_train, n_val, size)
    if path.exists():
        path.rmdir()  # make_shapes builds aside and renames into place, which needs the name free
    yaml_path = make_shapes(path, n_train, n_val, size, seed)
    Console(highlight=False).print(
        f"wrote {n_train} train / {n_val} val images of {size} px to {path}; train with data={yaml_path}"
    )
    return 0


MAX_OBJECTS = 400  # per image; past this even 6 px objects hardly fit a 640 px image without hiding each other


def _count_range(value: str) -> tuple[int, int]:
    lo, sep, hi = value.strip().partition("-")
    try:
        r = (int(lo), int(hi) if sep else int(lo))
    except ValueError:
        raise ValueError("a count N or a range LO-HI of objects per image, such as 2-24") from None
    if not 0 <= r[0] <= r[1] <= MAX_OBJECTS:
        raise ValueError(f"a range LO-HI with 0 <= LO <= HI <= {MAX_OBJECTS}")
    return r


def _count_list(value: str) -> list[int]:
    try:
        counts = [int(v) for v in value.split(",")]
    except ValueError:
        raise ValueError(
            "comma-separated objects per image, one per segment of the train split, such as 2,40,150"
        ) from None
    if not all(0 <= c <= MAX_OBJECTS for c in counts):
        raise ValueError(f"counts between 0 and {MAX_OBJECTS}")
    return counts


def dense(
    out: str | None = None,
    n_train: int = 800,
    n_val: int = 200,
    size: int = 640,
    seed: int = 0,
    objects: tuple[int, int] | None = None,
    counts: list[int] | None = None,
    classes: int = 10,
) -> int:
    from libreyolo.data.dense import NAMES, make_dense

    path = _new_folder("dense", out, n_train, n_val, size)
    if objects is not None and counts is not None:
        raise ConfigError(
            f"objects={objects[0]}-{objects[1]} and counts={','.join(map(str, counts))}: give one; objects= is drawn "
            "per image, counts= sets it per segment of the train split"
        )
    if counts is not None and len(counts) > n_train:
        raise ConfigError(f"counts={','.join(map(str, counts))}: {len(counts)} segments but n_train={n_train} images")
    if not 1 <= classes <= len(NAMES):
        raise ConfigError(f"classes={classes}: between 1 and {len(NAMES)} ({', '.join(NAMES)})")
    if path.exists():
        path.rmdir()  # make_dense builds aside and renames into place, which needs the name free
    yaml_path = make_dense(
        path, n_train, n_val, size, seed, counts if counts is not None else objects or (2, 24), classes
    )
    per_image = [
        sum(1 for line in f.read_text().splitlines() if line.strip())
        for split in ("train", "val")
        for f in (path / "labels" / split).glob("*.txt")
    ]
    Console(highlight=False, soft_wrap=True).print(
        f"wrote {n_train} train / {n_val} val images of {size} px to {path}: {sum(per_image)} boxes, objects per "
        f"image min {min(per_image)} mean {sum(per_image) / len(per_image):.1f} max {max(per_image)}; train with "
        f"data={yaml_path}"
    )
    return 0


def _new_folder(command: str, out: str | None, n_train: int, n_val: int, size: int) -> Path:
    """The generators' shared checks: out= given and new (or empty), both splits non-empty, a sensible size."""
    if not out:
        raise ConfigError(f"data {command} needs out=DIR, the folder to write the dataset to")
    path = Path(out).expanduser()
    if path.exists() and any(path.iterdir()):
        raise ConfigError(f"out={path} exists and is not empty; choose a new folder (the generator never overwrites)")
    if min(n_train, n_val) < 1 or size < 32:
        raise ConfigError(
            f"n_train={n_train} n_val={n_val} size={size}: need at least one image per split and size >= 32"
        )
    return path
