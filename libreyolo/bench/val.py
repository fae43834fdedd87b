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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from libreyolo.cli.args import flag, parse_kv
from libreyolo.config import TrainConfig

if TYPE_CHECKING:
    from libreyolo.eval.validator import Stages

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
    from libreyolo.bench.tables import print_val_table

    print_val_table(report)
    return 0


@dataclass
class _Setup:
    """What the three passes share: the network on its device, its loss, one persistent loader and the run's keys."""

    cfg: TrainConfig
    model: Any  # LibreYOLO (imported lazily: this module loads with the CLI)
    data_yaml: str
    split: str
    device: torch.device
    net: torch.nn.Module
    loss_fn: Any
    autocast_dtype: torch.dtype | None
    amp_dtype: str
    amp_enabled: bool
    loader: Any
    batch: int
    workers: int
    eval_workers: int
    static: bool
    eval_graph: Any


def bench_val(
    cfg: TrainConfig,
    split: str = "val",
    static: bool = False,
    eval_workers: int | None = None,
    graph: bool | None = None,
) -> dict[str, Any]:
    s = _setup(cfg, split, static, eval_workers, graph)
    try:
        loader = _time_loader(s)
        warmup_s = _warm_up(s, loader.pop("warm"))
        # 2. stage by stage
        from libreyolo.eval.validator import Stages

        stages = Stages(s.device)
        t = time.perf_counter()
        staged = _validation(s, stages)
        staged_total = time.perf_counter() - t
        seconds = {k: stages.seconds.get(k, 0.0) for k in STAGES[:-1]}
        seconds["coco_eval"] = staged["eval_s"]
        # 3. end to end, as training validates
        t = time.perf_counter()
        plain = _validation(s)
        e2e = time.perf_counter() - t
    finally:
        s.loader.close()
    images = plain["images"]
    return {
        "meta": _meta(s),
        "images": images,
        "detections": plain["detections"],
        "loader": {**loader, "warmup_s": warmup_s},
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


def _setup(cfg: TrainConfig, split: str, static: bool, eval_workers: int | None, graph: bool | None) -> _Setup:
    from libreyolo import LibreYOLO
    from libreyolo.amp import resolve_amp
    from libreyolo.data.config import list_images, load_data_config
    from libreyolo.data.dataset import YOLODataset, capacity
    from libreyolo.data.labels import scan_labels
    from libreyolo.data.loader import ValLoader, cpu_count, default_workers
    from libreyolo.distributed.device import first_device
    from libreyolo.errors import DataError
    from libreyolo.eval.graphed import EvalGraph

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
    amp = resolve_amp(cfg.amp, cfg.amp_dtype, device)
    net = model.net.to(device).eval()
    loss_fn = model.family.loss(net, TrainConfig.from_overrides({}, family=model.family))  # the family's own loss gains
    loader = ValLoader(
        YOLODataset(ls, cfg.imgsz, augment=False), batch, workers, device.type == "cuda", persistent=True
    )
    graph = device.type == "cuda" if graph is None else graph and device.type == "cuda"
    eval_graph = (
        EvalGraph(net, loss_fn, amp.autocast_dtype, capacity(max(map(len, ls.labels), default=0))) if graph else None
    )
    return _Setup(
        cfg,
        model,
        str(dc.yaml_path),
        split,
        device,
        net,
        loss_fn,
        amp.autocast_dtype,
        amp.dtype,
        amp.enabled,
        loader,
        batch,
        workers,
        eval_workers or min(8, cpu_count()),
        static or graph,
        eval_graph,
    )


def _time_loader(s: _Setup) -> dict[str, Any]:
    """1. the loader alone -> images, seconds, img_s, first_batch_s and the first non-empty batch (warm)."""
    t0 = time.perf_counter()
    first_s, n_images, warm = None, 0, None
    for b in s.loader:
        first_s = first_s if first_s is not None else time.perf_counter() - t0
        n_images += b["img"].shape[0]
        warm = warm or (b if b["img"].shape[0] else None)
    loader_s = time.perf_counter() - t0
    return {
        "images": n_images,
        "seconds": loader_s,
        "img_s": n_images / max(loader_s, 1e-9),
        "first_batch_s": first_s,
        "warm": warm,
    }


def _warm_up(s: _Setup, warm: dict[str, torch.Tensor] | None) -> float:
    """One batch through the network and its post-processing (cuDNN, allocator) -> seconds."""
    from libreyolo.eval.validator import to_input

    t = time.perf_counter()
    if warm is not None:
        dtype = s.autocast_dtype
        with torch.no_grad(), torch.autocast(s.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            c = s.cfg
            s.model.family.postprocess(
                s.net, s.net(to_input(warm["img"], s.device)), (c.imgsz, c.imgsz), c.conf, c.iou, c.max_det, True
            )
        if s.device.type == "cuda":
            torch.cuda.synchronize(s.device)
    return time.perf_counter() - t


def _validation(s: _Setup, stages: Stages | None = None) -> dict[str, Any]:
    from libreyolo.eval.validator import start_validation

    c = s.cfg
    return start_validation(
        s.net,
        s.model.family,
        s.loader,
        s.device,
        s.model.names,
        s.loss_fn,
        c.conf,
        c.iou,
        c.max_det,
        s.autocast_dtype,
        static_shape=s.static,
        eval_workers=s.eval_workers,
        stages=stages,
        graph=s.eval_graph,
    ).result()


def _meta(s: _Setup) -> dict[str, Any]:
    from libreyolo.nn import nms

    c, device = s.cfg, s.device
    return {
        "model": s.model.model_name,
        "nms_chunk": nms.CUDA_BOXES_PER_CALL,
        "nms_prefix": nms.PREFIX_MIN,
        "trained": s.model.trained,
        "data": s.data_yaml,
        "split": s.split,
        "imgsz": c.imgsz,
        "batch": s.batch,
        "workers": s.workers,
        "eval_workers": s.eval_workers,
        "static": s.static,
        "graph": s.eval_graph is not None,
        "graph_error": s.eval_graph.error if s.eval_graph is not None else None,
        "conf": c.conf,
        "iou": c.iou,
        "max_det": c.max_det,
        "amp": s.amp_enabled,
        "amp_dtype": s.amp_dtype,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
