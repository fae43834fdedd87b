"""The training loader's epochs with cache=false, auto (filled as the first epoch decodes) and ram (built first).

    python benchmarks/cache_fill.py --data /tmp/s1280/data.yaml [--imgsz 640] [--batch 16] [--workers 2] [--epochs 3]

For each mode, in a fresh set of worker processes: the seconds to open the cache (ram: build it), to the first
batch (the workers' start included), then each epoch's wall time through the loader alone (no model), mosaic on as
in training, one JSON line per mode. What cache=auto is for: the first epoch decodes as without a cache, later ones
read what it stored, and nothing waits at the start."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from libreyolo.data.cache import open_image_cache
from libreyolo.data.config import list_images, load_data_config
from libreyolo.data.dataset import AugmentConfig, YOLODataset
from libreyolo.data.labels import scan_labels
from libreyolo.data.loader import train_loader


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--modes", default="false,auto,ram")
    a = ap.parse_args()
    os.environ.setdefault("LIBREYOLO_SHM_DIR", tempfile.mkdtemp(prefix="cache-fill-"))
    dc = load_data_config(a.data)
    ls = scan_labels(list_images(dc.train), dc.nc)
    for mode in a.modes.split(","):
        t = time.perf_counter()
        src = open_image_cache(mode if mode != "false" else False, ls, a.imgsz, "train", [], progress=False)
        open_s = time.perf_counter() - t
        ds = YOLODataset(ls, a.imgsz, True, AugmentConfig(), seed=0, image_source=src)
        dl = train_loader(ds, a.batch, a.workers, seed=0, pin=False)
        epochs, first_batch_s = [], None
        for epoch in range(a.epochs):
            dl.batch_sampler.set_epoch(epoch, True)
            t = time.perf_counter()
            for _ in dl:
                if first_batch_s is None:  # the workers' start and their first batch: what a run's start waits for
                    first_batch_s = round(time.perf_counter() - t, 3)
            epochs.append(round(time.perf_counter() - t, 2))
        cached = sum(src.get(i) is not None for i in range(len(ls))) if src is not None else 0
        print(
            json.dumps(
                {
                    "mode": mode,
                    "images": len(ls),
                    "open_s": round(open_s, 3),
                    "first_batch_s": first_batch_s,
                    "epoch_s": epochs,
                    "cached": cached,
                    "workers": a.workers,
                }
            ),
            flush=True,
        )
        del dl
        if src is not None:
            src.close()


if __name__ == "__main__":
    main()
