"""A synthetic dataset that is hard in the ways real data is: many objects per image (up to hundreds), sizes from
6 px to 40% of the side with small ones dominating, ten shape classes, unlabelled clutter that looks like objects,
textured photograph-like backgrounds, occlusion, JPEG artefacts and sensor noise; `libreyolo data dense`.

Deterministic: each image draws from its own generator seeded by (seed, split, index), so a process pool writes
the same files as one process. The folder is built aside (`.partial-PID`) and renamed into place when complete."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np

from libreyolo.data.shapes import move_into_place

NAMES = ["circle", "square", "triangle", "cross", "star", "ring", "ellipse", "diamond", "hexagon", "arrow"]
VERSION = 1
MIN_PX = 6  # smallest object side; below this a shape's class cannot be told from its pixels
MAX_FRAC = 0.4  # largest object side, as a fraction of the image's shorter side
MIN_VISIBLE = 0.5  # every labelled object keeps at least half of its pixels visible (border and occluders)
FILL = 0.55  # objects' total drawn area at most this fraction of the image, so placements mostly succeed
PROCESSES_FROM = 64  # images; fewer are written in this process: starting workers would cost more than it saves


def make_dense(
    out: str | os.PathLike,
    n_train: int,
    n_val: int,
    size: int = 640,
    seed: int = 0,
    objects: tuple[int, int] | list[int] = (2, 24),
    classes: int = 10,
    distractors: tuple[int, int] = (0, 30),
    workers: int | None = None,
) -> Path:
    """Write images/{train,val}, labels/{train,val} and data.yaml under `out`; returns the yaml path.

    `objects` is either a tuple (lo, hi): each image draws its count from lo..hi inclusive, or a list of counts
    (a schedule): the train split is cut into len(list) consecutive segments, the k-th with about objects[k]
    objects per image (within 10%), and the val images cycle through the counts. `classes` takes the first that
    many of NAMES. `workers`: processes (None: one per CPU, up to 8, when there are at least PROCESSES_FROM images)."""
    if not 1 <= classes <= len(NAMES):
        raise ValueError(f"classes={classes}: between 1 and {len(NAMES)}")
    schedule = isinstance(objects, list)
    if not objects or min(objects) < 0 or (not schedule and (len(objects) != 2 or objects[0] > objects[1])):
        raise ValueError(f"objects={objects!r}: a range (lo, hi) with 0 <= lo <= hi, or a list of counts >= 0")
    out = Path(out)
    tmp = out.with_name(out.name + f".partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for split in ("train", "val"):
        (tmp / "images" / split).mkdir(parents=True)
        (tmp / "labels" / split).mkdir(parents=True)
    spec = dict(tmp=str(tmp), n_train=n_train, n_val=n_val, size=size, seed=seed, objects=list(objects))
    spec.update(schedule=schedule, classes=classes, distractors=list(distractors))
    if workers is None:
        workers = min(os.cpu_count() or 1, 8) if n_train + n_val >= PROCESSES_FROM else 0
    try:
        if workers > 1:
            _in_processes(spec, workers)
        else:
            _write_shard(spec, 0, 1)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    names = "".join(f"  {i}: {n}\n" for i, n in enumerate(NAMES[:classes]))
    (tmp / "data.yaml").write_text(
        f"# libreyolo dense synthetic dataset (v{VERSION}): size {size}, seed {seed}, objects {objects}, "
        f"distractors {distractors}\npath: .\ntrain: images/train\nval: images/val\nnames:\n{names}"
    )
    move_into_place(tmp, out)
    return out / "data.yaml"


def _in_processes(spec: dict, workers: int) -> None:
    """Each of `workers` fresh interpreters writes every workers-th image. Not multiprocessing: a forked child
    hangs once OpenCV has started its thread pool in the parent, and spawn re-runs the caller's __main__ (a
    script without a main guard, or one read from stdin, then fails)."""
    root = str(Path(__file__).resolve().parents[2])  # where this libreyolo is imported from, installed or not
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    # one OpenCV thread each: the workers already use every core, OpenCV's own threads would only contend
    code = (
        "import sys, json, cv2; cv2.setNumThreads(1); from libreyolo.data.dense import _write_shard; "
        "_write_shard(json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(spec), str(r), str(workers)], env=env, stderr=subprocess.PIPE
        )
        for r in range(workers)
    ]
    errors = [p.communicate()[1].decode(errors="replace") for p in procs]
    for p, err in zip(procs, errors):
        if p.returncode:
            raise RuntimeError(f"dense dataset worker exited with {p.returncode}:\n{err.strip()}")


def _write_shard(spec: dict, r: int, workers: int) -> None:
    jobs = [(split, i, n) for split, n in (("train", spec["n_train"]), ("val", spec["n_val"])) for i in range(n)]
    for split, i, n in jobs[r::workers]:
        _write_one(spec, split, i, n)


def _write_one(spec: dict, split: str, i: int, n: int) -> None:
    rng = np.random.default_rng([spec["seed"], int(split == "val"), i])
    objects = spec["objects"]
    if spec["schedule"]:
        c = objects[i % len(objects)] if split == "val" else objects[min(len(objects) * i // n, len(objects) - 1)]
        count = max(0, c + round(c * 0.1 * rng.uniform(-1, 1)))
    else:
        count = int(rng.integers(objects[0], objects[1] + 1))
    lo, hi = spec["distractors"]
    img, rows = draw_scene(rng, spec["size"], count, spec["classes"], int(rng.integers(lo, hi + 1)))
    tmp, name = spec["tmp"], f"{split}_{i:05d}"
    cv2.imwrite(f"{tmp}/images/{split}/{name}.jpg", img, [cv2.IMWRITE_JPEG_QUALITY, int(rng.integers(55, 96))])
    Path(f"{tmp}/labels/{split}/{name}.txt").write_text(
        "".join(f"{c} {x:.6f} {y:.6f} {w:.6f} {h:.6f}\n" for c, x, y, w, h in rows)
    )


def draw_scene(
    rng: np.random.Generator, size: int, count: int, classes: int = 10, n_distractors: int = 10
) -> tuple[np.ndarray, list[tuple[int, float, float, float, float]]]:
    """One BGR image and its labels (class, cx, cy, w, h normalised). An object that finds no place where it and
    every earlier one keep MIN_VISIBLE of their pixels is left out, so no label marks a hidden object; FILL keeps
    that rare."""
    h = w = size
    if rng.random() < 0.5:  # non-square half the time, so letterboxing is exercised
        h = int(size * rng.uniform(0.6, 0.95))
        if rng.random() < 0.5:
            h, w = w, h
    img = _background(rng, h, w)
    for _ in range(n_distractors):
        _distractor(rng, img)
    # log-uniform sizes make small objects dominate; shrunk together if they could not fit the image
    hi = max(MIN_PX, MAX_FRAC * min(h, w))
    sides = np.exp(rng.uniform(math.log(MIN_PX), math.log(hi), count))
    total = float((sides**2).sum())
    if total > FILL * h * w:
        sides = np.maximum(MIN_PX, sides * math.sqrt(FILL * h * w / total))
    owner = np.full((h, w), -1, np.int32)  # which object each pixel shows (-1: background or clutter)
    full, visible, regions, kept = [], [], [], []
    for side in sorted(sides, reverse=True):  # large first: small ones on top hide little of them
        cls = int(rng.integers(0, classes))
        placed = _place(rng, img, owner, full, visible, cls, float(side))
        if placed is not None:
            regions.append(placed)
            kept.append(cls)
    rows = []
    for k, (cls, (y0, x0, y1, x1)) in enumerate(zip(kept, regions)):
        # boxes of what is visible: an occluded corner is not part of the object's box in the image
        ys, xs = np.nonzero(owner[y0:y1, x0:x1] == k)
        bx1, bx2, by1, by2 = x0 + xs.min(), x0 + xs.max() + 1, y0 + ys.min(), y0 + ys.max() + 1
        rows.append((cls, (bx1 + bx2) / 2 / w, (by1 + by2) / 2 / h, (bx2 - bx1) / w, (by2 - by1) / h))
    if rng.random() < 0.2:
        img = cv2.GaussianBlur(img, (3, 3), 0)  # slight defocus
    k = int(rng.integers(0, 12))  # sensor noise, uniform: Gaussian draws at this size took longer than the scene
    return cv2.add(img, rng.integers(-k, k + 1, img.shape, dtype=np.int8), dtype=cv2.CV_8U), rows


def _place(rng, img, owner, full, visible, cls, side) -> tuple[int, int, int, int] | None:
    """Draw one object where it and every earlier object stay at least MIN_VISIBLE visible; (y0, x0, y1, x1) of
    its mask's region inside the image, or None after 40 tries (shrinking every 10)."""
    h, w = owner.shape
    angle = rng.uniform(0, 2 * math.pi)
    aspect = rng.uniform(0.35, 0.65)
    for t in range(40):
        if t % 10 == 0:
            alpha = _shape(NAMES[cls], side, angle, aspect)
            solid = alpha >= 0.5
            area = int(solid.sum())
            side = max(MIN_PX, side * 0.75)
        m = alpha.shape[0]
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        x0, y0 = int(cx) - m // 2, int(cy) - m // 2
        ax, ay = max(0, -x0), max(0, -y0)  # the part of the mask inside the image
        bx, by = min(m, w - x0), min(m, h - y0)
        if bx <= ax or by <= ay:
            continue
        mine = solid[ay:by, ax:bx]
        if mine.sum() < MIN_VISIBLE * area:
            continue
        under = owner[y0 + ay : y0 + by, x0 + ax : x0 + bx]
        hit = under[mine]
        ids, lost = np.unique(hit[hit >= 0], return_counts=True)
        if any(visible[k] - n < MIN_VISIBLE * full[k] for k, n in zip(ids, lost)):
            continue
        for k, n in zip(ids, lost):
            visible[k] -= n
        under[mine] = len(full)
        full.append(area)
        visible.append(int(mine.sum()))
        patch = img[y0 + ay : y0 + by, x0 + ax : x0 + bx]
        a = alpha[ay:by, ax:bx, None]
        color = _contrasting(rng, patch[mine].mean(0))
        # a linear shade across the object, as light falls on real ones; flat fills are easier than data
        d = rng.uniform(0, 2 * math.pi)
        ys, xs = (np.arange(ay, by)[:, None] - m / 2) / m, (np.arange(ax, bx)[None, :] - m / 2) / m
        shade = 1 + rng.uniform(0, 0.35) * (ys * math.sin(d) + xs * math.cos(d))[..., None]
        patch[:] = np.clip(patch * (1 - a) + color * shade * a, 0, 255).astype(np.uint8)
        return y0 + ay, x0 + ax, y0 + by, x0 + bx
    return None


def _contrasting(rng, bg: np.ndarray) -> np.ndarray:
    """A random colour at least 160 (summed over BGR) from the mean of the pixels it covers."""
    for _ in range(6):
        c = rng.integers(0, 256, 3)
        if np.abs(c - bg).sum() >= 160:
            return c.astype(np.float32)
    return (rng.integers(0, 40, 3) if bg.mean() > 127 else rng.integers(215, 256, 3)).astype(np.float32)


_SHIFT = 4  # cv2 draws at 1/16 px, so tiny shapes keep their geometry


def _pts(xy, r: float, angle: float, m: int) -> np.ndarray:
    xy = np.asarray(xy, np.float64) * r
    c, s = math.cos(angle), math.sin(angle)
    xy = xy @ np.array([[c, s], [-s, c]]) + m / 2
    return np.round(xy * (1 << _SHIFT)).astype(np.int32)


def _poly(n: int, inner: float = 0.0) -> list[tuple[float, float]]:
    """A regular n-gon on the unit circle (a vertex up), or with inner > 0 a star alternating radius 1 and inner."""
    k = 2 * n if inner else n
    radii = [inner if inner and j % 2 else 1.0 for j in range(k)]
    return [(r * math.sin(2 * math.pi * j / k), -r * math.cos(2 * math.pi * j / k)) for j, r in enumerate(radii)]


def _turn(xy: list[tuple[float, float]], quarters: int) -> list[tuple[float, float]]:
    for _ in range(quarters):
        xy = [(-y, x) for x, y in xy]
    return xy


_UNIT = {
    "square": [(-0.7, -0.7), (0.7, -0.7), (0.7, 0.7), (-0.7, 0.7)],
    "triangle": _poly(3),
    "cross": [(x * 0.95, y * 0.95) for k in range(4) for x, y in _turn([(-0.33, -1), (0.33, -1), (0.33, -0.33)], k)],
    "star": _poly(5, 0.42),
    "diamond": [(0, -1), (0.58, 0), (0, 1), (-0.58, 0)],
    "hexagon": _poly(6),
    "arrow": [(-1, -0.22), (0.2, -0.22), (0.2, -0.6), (1, 0), (0.2, 0.6), (0.2, 0.22), (-1, 0.22)],
}
_SMALL_TURN = {"square", "diamond"}  # turned far, a square becomes a diamond and back


def _shape(kind: str, side: float, angle: float, aspect: float) -> np.ndarray:
    """Anti-aliased coverage (m, m) float32 in 0..1 of one shape of extent `side` centred in the square."""
    r = side / 2
    m = int(math.ceil(side)) + 3
    mask = np.zeros((m, m), np.uint8)
    centre = (round(m / 2 * (1 << _SHIFT)),) * 2
    if kind == "circle":
        cv2.circle(mask, centre, round(r * (1 << _SHIFT)), 255, -1, cv2.LINE_AA, _SHIFT)
    elif kind == "ring":
        t = max(2, round(r * 0.32))
        cv2.circle(mask, centre, round((r - t / 2) * (1 << _SHIFT)), 255, t, cv2.LINE_AA, _SHIFT)
    elif kind == "ellipse":
        axes = (round(r * (1 << _SHIFT)), round(r * aspect * (1 << _SHIFT)))
        cv2.ellipse(mask, centre, axes, math.degrees(angle), 0, 360, 255, -1, cv2.LINE_AA, _SHIFT)
    else:
        if kind in _SMALL_TURN:
            angle = (angle / math.pi - 1) * math.radians(20)  # within +-20 degrees
        cv2.fillPoly(mask, [_pts(_UNIT[kind], r, angle, m)], 255, cv2.LINE_AA, _SHIFT)
    return mask.astype(np.float32) / 255


def _fbm(rng, h: int, w: int, octaves: int) -> np.ndarray:
    """Multi-octave value noise in 0..1: random grids, each twice as fine and half as strong, upsampled."""
    out = np.zeros((h, w), np.float32)
    for o in range(octaves):
        g = 2 ** (o + 1)
        grid = rng.random((max(2, g * h // max(h, w)) + 1, max(2, g * w // max(h, w)) + 1), np.float32)
        out += cv2.resize(grid, (w, h), interpolation=cv2.INTER_CUBIC) * 0.5**o
    out -= out.min()
    return out / max(float(out.max()), 1e-6)


def _two_colours(rng, t: np.ndarray) -> np.ndarray:
    """t (h, w) in 0..1 -> a BGR uint8 image between two random colours, through a lookup table (float
    arithmetic on three full-size channels cost most of a background)."""
    c0, c1 = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    lut = (c0 + (c1 - c0) * np.linspace(0, 1, 256)[:, None]).astype(np.uint8)[:, None, :]
    t8 = (t * 255).astype(np.uint8)
    return cv2.LUT(cv2.merge([t8, t8, t8]), lut)


def _background(rng, h: int, w: int) -> np.ndarray:
    """One or two of: value noise, a gradient, stripes or a checkerboard, blurred rectangles; blended."""
    layers = []
    yy, xx = np.arange(h, dtype=np.float32)[:, None], np.arange(w, dtype=np.float32)[None, :]
    for kind in rng.choice(4, size=1 + int(rng.random() < 0.5), replace=False):
        if kind == 0:
            layers.append(_two_colours(rng, _fbm(rng, h, w, int(rng.integers(3, 7)))))
        elif kind == 1:
            a = rng.uniform(0, 2 * math.pi)
            t = xx * math.cos(a) + yy * math.sin(a)
            layers.append(_two_colours(rng, (t - t.min()) / max(float(t.max() - t.min()), 1.0)))
        elif kind == 2:
            a, period = rng.uniform(0, math.pi), rng.uniform(6, max(8, min(h, w) / 4))
            u = np.sin((xx * math.cos(a) + yy * math.sin(a)) * (2 * math.pi / period))
            if rng.random() < 0.5:  # checkerboard
                u = u * np.sin((yy * math.cos(a) - xx * math.sin(a)) * (2 * math.pi / period))
            t = (u > 0).astype(np.float32) if rng.random() < 0.5 else (u + 1) / 2
            layers.append(_two_colours(rng, cv2.GaussianBlur(t, (0, 0), rng.uniform(0.5, 2))))
        else:
            # drawn and blurred at a quarter of the size, then upsampled: the blur is wide, so nothing is lost
            sh, sw = max(2, h // 4), max(2, w // 4)
            base = np.empty((sh, sw, 3), np.uint8)
            base[:] = rng.integers(0, 256, 3)
            for _ in range(int(rng.integers(5, 30))):
                p = rng.integers(0, (sw, sh), (2, 2))
                cv2.rectangle(base, tuple(map(int, p[0])), tuple(map(int, p[1])), _col(rng), -1)
            base = cv2.GaussianBlur(base, (0, 0), rng.uniform(0.5, 3))
            layers.append(cv2.resize(base, (w, h), interpolation=cv2.INTER_LINEAR))
    if len(layers) == 1:
        return layers[0]
    wt = rng.uniform(0.2, 0.5)
    return cv2.addWeighted(layers[0], 1 - wt, layers[1], wt, 0)


def _col(rng) -> tuple[int, int, int]:
    return tuple(int(v) for v in rng.integers(0, 256, 3))


_GLYPHS = "abcdefghkmnpqrsuvwxyzABEFGHKLMNPRSTUVWXYZ0123456789#%&@?"


def _distractor(rng, img: np.ndarray) -> None:
    """Unlabelled clutter drawn under the objects: line segments, scribbles, irregular blobs, text, open polygon
    outlines and arcs (near misses of the triangle, square and ring classes)."""
    h, w = img.shape[:2]
    s = float(np.exp(rng.uniform(math.log(MIN_PX), math.log(max(MIN_PX + 1, MAX_FRAC * min(h, w))))))
    c = np.array([rng.uniform(0, w), rng.uniform(0, h)])
    color, kind = _col(rng), int(rng.integers(0, 6))
    th = max(1, round(s * rng.uniform(0.03, 0.12)))
    if kind == 0:
        d = np.array([math.cos(a := rng.uniform(0, 2 * math.pi)), math.sin(a)]) * s
        cv2.line(img, tuple(map(int, c - d)), tuple(map(int, c + d)), color, th, cv2.LINE_AA)
    elif kind == 1:
        pts = c + np.cumsum(rng.normal(0, s / 6, (int(rng.integers(4, 14)), 2)), 0)
        cv2.polylines(img, [pts.astype(np.int32)], False, color, th, cv2.LINE_AA)
    elif kind == 2:
        k = int(rng.integers(7, 14))
        a = np.sort(rng.uniform(0, 2 * math.pi, k))
        rad = s / 2 * rng.uniform(0.4, 1.0, k)
        pts = c + np.stack([np.cos(a) * rad, np.sin(a) * rad], 1)
        cv2.fillPoly(img, [pts.astype(np.int32)], color, cv2.LINE_AA)
    elif kind == 3:
        text = "".join(rng.choice(list(_GLYPHS), int(rng.integers(1, 5))))
        scale = max(0.3, s / 40)
        font = int(rng.choice([cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX, cv2.FONT_HERSHEY_SCRIPT_SIMPLEX]))
        cv2.putText(img, text, tuple(map(int, c)), font, scale, color, max(1, round(scale * 1.5)), cv2.LINE_AA)
    elif kind == 4:
        n = int(rng.integers(3, 5))
        pts = _pts(_poly(n), s / 2, rng.uniform(0, 2 * math.pi), 0)[: int(rng.integers(2, n + 1))]
        cv2.polylines(img, [pts + (c * (1 << _SHIFT)).astype(np.int32)], False, color, th, cv2.LINE_AA, _SHIFT)
    else:
        span = rng.uniform(60, 250)
        start = rng.uniform(0, 360)
        axes = (int(s / 2), int(s / 2 * rng.uniform(0.7, 1.0)))
        cv2.ellipse(img, tuple(map(int, c)), axes, 0, start, start + span, color, th, cv2.LINE_AA)
