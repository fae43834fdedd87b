"""libreyolo bench loader: images/s of the training data loader alone (no model, no GPU work), for each
cache mode and a range of worker counts, so a user sees what this machine can feed a GPU.

Each row builds (or reuses) its cache first, reads every file once so the OS page cache is warm (the
steady state of every epoch after the first when the data fits in memory), starts the loader, discards
`warmup` batches (worker start-up, queues filling) and times the next `batches` batches of the training
pipeline (mosaic, affine, HSV, flip; uint8 batches, pinned when CUDA is present), and reports the CPU
time per image of the training process and its workers, which depends much less on other load than images/s."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import psutil
import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from libreyolo.cli.args import flag, parse_kv
from libreyolo.errors import ConfigError

USAGE = """usage: libreyolo bench loader data=my.yaml [imgsz=640] [batch=16] [workers=0,1,2,4] [cache=none,disk,ram]
                            [batches=50] [warmup=auto] [mosaic=true] [seed=0] [json=false]

  workers  worker counts to try (default: 0, 1, 2, 4, 8, ... up to the CPU count, and the training default)
  cache    cache modes to try: none, disk, ram (default: all three)
  batches  timed batches per row; warmup: batches discarded first (default 2 x workers + 2)
  json     print one JSON object instead of the table"""


def _ints(v: str) -> list[int]:
    try:
        out = [int(x) for x in str(v).strip("[]").split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"workers={v!r}: expected a comma-separated list of integers, e.g. workers=0,2,4") from None
    if not out or min(out) < 0:
        raise ConfigError(f"workers={v!r}: expected integers >= 0")
    return out


def _modes(v: str) -> list[str]:
    aliases = {"none": "none", "false": "none", "off": "none", "0": "none", "disk": "disk", "ram": "ram", "true": "ram"}
    out = []
    for m in str(v).strip("[]").split(","):
        if m.strip().lower() not in aliases:
            raise ConfigError(f"cache={v!r}: {m.strip()!r} is not one of none, disk, ram")
        out.append(aliases[m.strip().lower()])
    return out


def default_worker_counts(batch: int) -> list[int]:
    from libreyolo.data.cpus import cpu_count
    from libreyolo.data.loader import default_workers

    cpus = cpu_count()
    counts = {0, cpus, default_workers(batch, max(1, torch.cuda.device_count()))}
    k = 1
    while k < cpus:
        counts.add(k)
        k *= 2
    return sorted(counts)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    kw = parse_kv(
        argv,
        {"data", "imgsz", "batch", "seed"},
        {
            "workers": _ints,
            "cache": _modes,
            "batches": int,
            "warmup": int,
            "mosaic": flag,
            "json": flag,
        },
    )
    as_json = kw.pop("json", False)
    report = bench(**kw, progress=not as_json)
    if as_json:
        print(json.dumps(report))
    else:
        print_report(report)
    return 0


def bench(
    data: str = "shapes",
    imgsz: int = 640,
    batch: int = 16,
    workers: list[int] | None = None,
    cache: list[str] | None = None,
    batches: int = 50,
    warmup: int | None = None,
    mosaic: bool = True,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """-> {machine and settings..., "results": [{cache, workers, img_s, ms_per_batch, ...}], "notes": [...]}"""
    from libreyolo.data.cache import open_image_cache
    from libreyolo.data.config import list_images, load_data_config
    from libreyolo.data.cpus import cpu_count
    from libreyolo.data.dataset import AugmentConfig, YOLODataset
    from libreyolo.data.labels import scan_labels

    if batch < 1 or batches < 1:
        raise ConfigError(f"batch={batch} batches={batches}: both must be at least 1")
    workers = workers if workers is not None else default_worker_counts(batch)
    cache = cache or ["none", "disk", "ram"]
    dc = load_data_config(data)
    images = list_images(dc.train)
    ls = scan_labels(images, dc.nc)
    if not len(ls):
        raise ConfigError(f"{dc.yaml_path}: train: no usable images to benchmark")
    pin = torch.cuda.is_available()
    report: dict[str, Any] = {
        "cpu": cpu_name(),
        "cpus": cpu_count(),
        "torch": torch.__version__,
        "data": str(dc.yaml_path),
        "images": len(ls),
        "imgsz": imgsz,
        "batch": batch,
        "batches": batches,
        "mosaic": mosaic,
        "pin_memory": pin,
        "results": [],
        "notes": [],
        "date": time.strftime("%Y-%m-%d"),
        "load_avg": [_load_avg()],
    }
    for mode in cache:
        notes: list[str] = []
        t0 = time.perf_counter()
        src = open_image_cache(mode, ls, imgsz, "train", notes, progress=progress) if mode != "none" else None
        build_s = time.perf_counter() - t0
        report["notes"] += notes
        try:
            # none reads the image files, disk its .npy entries; ram holds everything in memory already
            _warm_page_cache([str(f) for f in ls.files] if src is None else getattr(src, "entries", []))
            ds = YOLODataset(ls, imgsz, augment=True, hyp=AugmentConfig(), seed=seed, image_source=src)
            for w in workers:
                wu = warmup if warmup is not None else 2 * w + 2
                img_s, ms, cpu_ms = _time_loader(ds, batch, w, batches, wu, mosaic, seed, pin)
                report["results"].append(
                    {
                        "cache": mode,
                        "used": src.mode if src is not None else "none",
                        "workers": w,
                        "img_s": round(img_s, 1),
                        "ms_per_batch": round(ms, 2),
                        "cpu_ms_per_img": round(cpu_ms, 2),
                        "warmup_batches": wu,
                        "cache_build_s": round(build_s, 2),
                    }
                )
        finally:
            if src is not None:
                src.close()
    report["load_avg"].append(_load_avg())  # other work on the machine while measuring (1-minute load average)
    return report


def _load_avg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _warm_page_cache(paths: list[str]) -> None:
    for p in paths:
        try:
            with open(p, "rb") as f:
                while f.read(1 << 20):
                    pass
        except OSError:
            pass  # a missing entry is read (and decoded) by the loader as training would


def _time_loader(
    ds: Any, batch: int, workers: int, batches: int, warmup: int, mosaic: bool, seed: int, pin: bool
) -> tuple[float, float, float]:
    """-> images/s, ms per batch and CPU ms per image over `batches` batches after `warmup`; epochs roll
    over within one pass, as in training."""
    from libreyolo.data.loader import release_workers, train_loader

    dl = train_loader(ds, batch, workers, seed, pin)
    sampler = dl.batch_sampler
    # one pass over as many epochs as the batches need, as training makes it (no pause between epochs)
    epochs = -(-(warmup + batches) // sampler.batches_per_epoch())
    sampler.set_span([(e, mosaic) for e in range(epochs)])
    it = iter(dl)
    for _ in range(warmup):
        next(it)
    n = 0
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    for _ in range(batches):
        n += len(next(it)["img"])
    elapsed = time.perf_counter() - t0
    cpu = sum(v - cpu0[pid] for pid, v in _cpu_seconds().items() if pid in cpu0)
    release_workers(dl)  # the workers and the staging thread end before the next row starts its own
    return n / elapsed, elapsed / batches * 1000, cpu / n * 1000


def _cpu_seconds() -> dict[int, float]:
    """CPU seconds (user + system) of this process and each loader worker. CPU per image depends much less
    than images/s on what else runs: cores / (CPU s per image) is about what a free machine would feed."""
    me = psutil.Process()
    out = {}
    for p in [me, *me.children()]:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.Error:
            pass  # a worker that just exited
    return out


def print_report(r: dict[str, Any]) -> None:
    console = Console(highlight=False)
    for note in r["notes"]:
        Console(stderr=True, highlight=False, soft_wrap=True).print(f"[yellow]warning:[/] {escape(note)}")
    t = Table(
        title=f"data loader, {r['images']} images at imgsz {r['imgsz']}, batch {r['batch']}, "
        f"mosaic {'on' if r['mosaic'] else 'off'}"
    )
    for col in ("cache", "workers", "img/s", "ms/batch", "CPU ms/img", "cache build s"):
        t.add_column(col, justify="left" if col == "cache" else "right")
    best = max(r["results"], key=lambda x: x["img_s"], default=None)
    for x in r["results"]:
        name = x["cache"] if x["used"] == x["cache"] else f"{x['cache']} (fell back to {x['used']})"
        style = "bold green" if x is best else None
        t.add_row(
            name,
            str(x["workers"]),
            f"{x['img_s']:.1f}",
            f"{x['ms_per_batch']:.1f}",
            f"{x['cpu_ms_per_img']:.1f}",
            f"{x['cache_build_s']:.1f}" if x["cache"] != "none" else "-",
            style=style,
        )
    console.print(t)
    console.print(
        f"{r['cpus']} CPUs ({r['cpu']}), torch {r['torch']}, pin_memory {r['pin_memory']}, {r['batches']} timed "
        "batches per row after warm-up, "
        f"load average {r['load_avg'][0]} -> {r['load_avg'][1]}, {r['date']}"
    )
    console.print(
        "CPU ms/img counts the training process and its workers: cores x 1000 / (CPU ms/img) is about what an "
        "otherwise idle machine feeds. A run is dataloader-bound when its step takes more images/s than this table "
        "gives at its workers (the profiler's dataloader verdict)."
    )
