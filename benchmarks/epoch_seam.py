"""What the training loader makes a step wait at epoch boundaries: one pass per epoch against one pass over all.

    python benchmarks/epoch_seam.py data=/tmp/s800/data.yaml [imgsz=640 batch=16 workers=15 epochs=6 step_ms=26
        end_ms=380 mosaic=false]

A consumer takes the training loader's batches and holds each for step_ms (standing in for a step the GPU runs
at that pace), then holds end_ms at each epoch's end (validation and checkpoints). `per_epoch` opens one loader
pass per epoch at the start of that pause, as training did before one pass spanned the run; `one_pass` opens a
single pass over every epoch, as training does now. No model runs: this measures the loader's side of the seam
only. Prints one JSON line per mode: the wait for each epoch's first batch after the first epoch, the data wait
of all steps, and the wall time."""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def run(mode: str, ds: Any, keys: dict[str, Any]) -> dict[str, Any]:
    from libreyolo.data.loader import train_loader

    dl = train_loader(ds, keys["batch"], keys["workers"], seed=0, pin=False)
    sampler, epochs = dl.batch_sampler, keys["epochs"]
    nb = sampler.batches_per_epoch()
    step_s, end_s = keys["step_ms"] / 1000, keys["end_ms"] / 1000
    if mode == "one_pass":
        sampler.set_span([(e, keys["mosaic"]) for e in range(epochs)])
    else:
        sampler.set_epoch(0, keys["mosaic"])
    it = iter(dl)
    next(it)  # workers started and the first batch made: both modes start from here
    first_waits, data_wait = [], 0.0
    t0 = time.perf_counter()
    for epoch in range(epochs):
        for i in range(1 if epoch == 0 else 0, nb):
            t = time.perf_counter()
            next(it)
            waited = time.perf_counter() - t
            data_wait += waited
            if i == 0:
                first_waits.append(round(waited * 1000, 1))
            time.sleep(step_s)
        if epoch + 1 < epochs:
            if mode == "per_epoch":
                sampler.set_epoch(epoch + 1, keys["mosaic"])
                it = iter(dl)
            time.sleep(end_s)
    wall = time.perf_counter() - t0
    del it, dl
    ideal = (epochs * nb - 1) * step_s + (epochs - 1) * end_s
    return {
        "mode": mode,
        "first_batch_wait_ms": first_waits,
        "first_batch_wait_s_total": round(sum(first_waits) / 1000, 3),
        "data_wait_s": round(data_wait, 3),
        "wall_s": round(wall, 3),
        "wall_without_waits_s": round(ideal, 3),
        **{k: keys[k] for k in ("batch", "workers", "imgsz", "epochs", "step_ms", "end_ms", "mosaic")},
        "batches_per_epoch": nb,
    }


def main() -> None:
    keys: dict[str, Any] = {
        "imgsz": 640, "batch": 16, "workers": 15, "epochs": 6, "step_ms": 26.0, "end_ms": 380.0, "mosaic": False,
    }  # fmt: skip
    data = None
    for arg in sys.argv[1:]:
        k, v = arg.split("=", 1)
        if k == "data":
            data = v
        elif k == "mosaic":
            keys[k] = v.lower() in ("1", "true", "yes")
        else:
            keys[k] = type(keys[k])(v)
    if data is None:
        raise SystemExit("data=PATH is required")
    from libreyolo.data.config import list_images, load_data_config
    from libreyolo.data.dataset import YOLODataset
    from libreyolo.data.labels import scan_labels

    dc = load_data_config(data)
    ds = YOLODataset(scan_labels(list_images(dc.train), dc.nc), keys["imgsz"], augment=True)
    for mode in ("per_epoch", "one_pass"):
        print(json.dumps(run(mode, ds, keys)), flush=True)


if __name__ == "__main__":
    main()
