"""libreyolo bench val: validation speed, stage by stage, on a dataset split.

Three passes over the split with one persistent validation loader (its workers start in the first pass):
1. loader: the loader alone (decode, letterbox, collate, pin), images/s with nothing else running;
2. stages: a validation with the device synchronised around every stage, so each stage's seconds are its own:
   loader wait, forward, loss, postprocess (decode + NMS + mapping boxes to original pixels), to_host (the one
   copy per batch), then the COCO evaluation; their sum is the pass's total;
3. end to end: a validation as training runs it (no extra synchronisation): the seconds the call holds the
   caller (time_s) plus the COCO evaluation (eval_s), and images/s over both.
One untimed batch first warms the device up (cuDNN, allocator)."""

from __future__ import annotations

import json
import time
from typing import Any

import torch

from libreyolo.cli.args import flag, parse_kv
from libreyolo.config import TrainConfig

KEYS = {"model", "data", "imgsz", "batch", "device", "workers", "conf", "iou", "max_det", "amp", "amp_dtype"}
# this benchmark's defaults where they differ from TrainConfig's: --help shows these, run() applies them
DEFAULTS: dict[str, object] = {"model": "LibreYOLO9t", "data": "shapes", "imgsz": 640}
STAGES = ("loader", "forward", "loss", "postprocess", "to_host", "coco_eval")


def run(argv: list[str]) -> int:
    extra = {
        "split": str,
        "json": flag,
        "static": flag,
        "graph": flag,
        "eval_workers": int,
        "nms_chunk": int,
        "nms_prefix": int,
    }
    if any(a in ("-h", "--help") for a in argv):
        from libreyolo.cli.help import show_help

        return show_help(
            "bench val",
            KEYS,
            {
                "split": "val (default) or test",
                "static": "pad every batch to batch= (one input shape)",
                "graph": "forward and loss replayed from a CUDA graph, as training validates (default: true on CUDA; "
                "implies static)",
                "eval_workers": "processes for a large COCO evaluation (default: up to 8, by CPUs)",
                "nms_chunk": "boxes per NMS call on CUDA (nn/nms.py CUDA_BOXES_PER_CALL)",
                "nms_prefix": "the first NMS round's minimum candidates per image (nn/nms.py PREFIX_MIN)",
                "json": "print JSON",
            },
            DEFAULTS,
        )
    kw = parse_kv(argv, KEYS, extra)
    as_json, split, static, graph = (
        kw.pop("json", False),
        kw.pop("split", "val"),
        kw.pop("static", False),
        kw.pop("graph", None),
    )
    eval_workers = kw.pop("eval_workers", None)
    from libreyolo.nn import nms

    nms.CUDA_BOXES_PER_CALL = kw.pop("nms_chunk", nms.CUDA_BOXES_PER_CALL)  # tuning knobs, this process only
    nms.PREFIX_MIN = kw.pop("nms_prefix", nms.PREFIX_MIN)
    report = bench_val(TrainConfig.from_overrides({**DEFAULTS, **kw}), split, static, eval_workers, graph)
    if as_json:
        print(json.dumps(report))
        return 0
    _print_table(report)
    return 0


def bench_val(
    cfg: TrainConfig,
    split: str = "val",
    static: bool = False,
    eval_workers: int | None = None,
    graph: bool | None = None,
) -> dict[str, Any]:
    from libreyolo import LibreYOLO
    from libreyolo.amp import resolve_amp
    from libreyolo.data.config import list_images, load_data_config
    from libreyolo.data.dataset import YOLODataset, capacity
    from libreyolo.data.labels import scan_labels
    from libreyolo.data.loader import ValLoader, cpu_count, default_workers
    from libreyolo.distributed.device import first_device
    from libreyolo.errors import DataError
    from libreyolo.eval.graphed import EvalGraph
    from libreyolo.eval.validator import Stages, start_validation, to_input

    device = first_device(cfg.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dc = load_data_config(cfg.data)
    model = LibreYOLO(cfg.model)
    if not model.trained:  # an untrained network, built for the dataset's classes (as training would)
        model.prepare_for_training(dc.names, fresh=True)
    elif len(dc.names) != model.nc:
        raise DataError(f"{dc.yaml_path} has {len(dc.names)} classes but {model.model_name} was trained for {model.nc}")
    ls = scan_labels(list_images(getattr(dc, split)), dc.nc)
    if not len(ls):
        raise DataError(f"{dc.yaml_path}: {split}: no usable images")
    batch = 32 if cfg.batch == -1 else cfg.batch
    workers = cfg.workers if cfg.workers is not None else default_workers(batch, 1 if device.type == "cuda" else 0)
    eval_workers = eval_workers or min(8, cpu_count())
    amp = resolve_amp(cfg.amp, cfg.amp_dtype, device)
    net = model.net.to(device).eval()
    loss_fn = model.family.loss(net, TrainConfig.from_overrides({}, family=model.family))  # the family's own loss gains
    loader = ValLoader(
        YOLODataset(ls, cfg.imgsz, augment=False), batch, workers, device.type == "cuda", persistent=True
    )
    graph = device.type == "cuda" if graph is None else graph and device.type == "cuda"
    static = static or graph
    eval_graph = (
        EvalGraph(net, loss_fn, amp.autocast_dtype, capacity(max(map(len, ls.labels), default=0))) if graph else None
    )

    def validation(stages: Stages | None = None) -> dict[str, Any]:
        return start_validation(
            net,
            model.family,
            loader,
            device,
            model.names,
            loss_fn,
            cfg.conf,
            cfg.iou,
            cfg.max_det,
            amp.autocast_dtype,
            static_shape=static,
            eval_workers=eval_workers,
            stages=stages,
            graph=eval_graph,
        ).result()

    try:
        # 1. the loader alone
        t0 = time.perf_counter()
        first_s, n_images, warm = None, 0, None
        for b in loader:
            first_s = first_s if first_s is not None else time.perf_counter() - t0
            n_images += b["img"].shape[0]
            warm = warm or (b if b["img"].shape[0] else None)
        loader_s = time.perf_counter() - t0
        # warm-up: one batch through the network
        t = time.perf_counter()
        if warm is not None:
            with (
                torch.no_grad(),
                torch.autocast(
                    device.type, dtype=amp.autocast_dtype or torch.float32, enabled=amp.autocast_dtype is not None
                ),
            ):
                model.family.postprocess(
                    net,
                    net(to_input(warm["img"], device)),
                    (cfg.imgsz, cfg.imgsz),
                    cfg.conf,
                    cfg.iou,
                    cfg.max_det,
                    True,
                )
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        warmup_s = time.perf_counter() - t
        # 2. stage by stage
        stages = Stages(device)
        t = time.perf_counter()
        staged = validation(stages)
        staged_total = time.perf_counter() - t
        seconds = {k: stages.seconds.get(k, 0.0) for k in STAGES[:-1]}
        seconds["coco_eval"] = staged["eval_s"]
        # 3. end to end, as training validates
        t = time.perf_counter()
        plain = validation()
        e2e = time.perf_counter() - t
    finally:
        loader.close()
    images = plain["images"]
    from libreyolo.nn import nms

    meta = {
        "model": model.model_name,
        "nms_chunk": nms.CUDA_BOXES_PER_CALL,
        "nms_prefix": nms.PREFIX_MIN,
        "trained": model.trained,
        "data": str(dc.yaml_path),
        "split": split,
        "imgsz": cfg.imgsz,
        "batch": batch,
        "workers": workers,
        "eval_workers": eval_workers,
        "static": static,
        "graph": graph,
        "graph_error": eval_graph.error if eval_graph is not None else None,
        "conf": cfg.conf,
        "iou": cfg.iou,
        "max_det": cfg.max_det,
        "amp": amp.enabled,
        "amp_dtype": amp.dtype,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    return {
        "meta": meta,
        "images": images,
        "detections": plain["detections"],
        "loader": {
            "images": n_images,
            "seconds": loader_s,
            "img_s": n_images / max(loader_s, 1e-9),
            "first_batch_s": first_s,
            "warmup_s": warmup_s,
        },
        "stages": {"seconds": seconds, "total_s": staged_total, "img_s": images / max(staged_total, 1e-9)},
        "end_to_end": {
            "seconds": e2e,
            "img_s": images / max(e2e, 1e-9),
            "time_s": plain["time_s"],
            "eval_s": plain["eval_s"],
        },
        "metrics": {k: plain[k] for k in ("precision", "recall", "map50", "map")},
        "losses": plain["losses"],
    }


def _print_table(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    m = r["meta"]
    t = Table(
        title=f"bench val: {m['model']} on {r['images']} images, batch {m['batch']}, imgsz {m['imgsz']}, "
        f"{m['amp_dtype']} on {m['gpu']}"
    )
    for c in ("stage", "seconds", "share", "img/s"):
        t.add_column(c, justify="right")
    total = r["stages"]["total_s"]
    for k, s in r["stages"]["seconds"].items():
        t.add_row(k, f"{s:.3f}", f"{s / max(total, 1e-9):.0%}", f"{r['images'] / s:.0f}" if s > 0 else "-")
    t.add_row("stages total", f"{total:.3f}", "", f"{r['stages']['img_s']:.0f}")
    e = r["end_to_end"]
    t.add_row("end to end", f"{e['seconds']:.3f}", "", f"{e['img_s']:.0f}")
    c = Console()
    c.print(t)
    ld = r["loader"]
    c.print(
        f"  loader alone: {ld['img_s']:.0f} img/s ({m['workers']} workers, first batch {ld['first_batch_s']:.2f} s); "
        f"end to end: {e['time_s']:.3f} s holding the caller + {e['eval_s']:.3f} s COCO evaluation; "
        f"{r['detections']:,} detections"
    )
    c.print(f"  mAP50 {r['metrics']['map50']:.4f}  mAP50-95 {r['metrics']['map']:.4f}")
