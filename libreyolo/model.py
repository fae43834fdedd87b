"""The LibreYOLO facade: build a network (random init) or load a checkpoint; train(), val(), predict()."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn

from libreyolo import oom
from libreyolo.config import TrainConfig
from libreyolo.engine.checkpoint import load_checkpoint, load_weights, save_atomic
from libreyolo.engine.loop import OnStart
from libreyolo.engine.snapshot import snapshot
from libreyolo.engine.state import model_record
from libreyolo.errors import CheckpointError, ConfigError
from libreyolo.export.meta import SUFFIXES as EXPORTED_SUFFIXES
from libreyolo.families import Family, get_family, model_names, parse_model_name
from libreyolo.tasks import get_task
from libreyolo.weights import SUFFIXES as WEIGHT_SUFFIXES
from libreyolo.weights import load as read_weights
from libreyolo.weights.transfer import start_from, transfer


class LibreYOLO:
    """LibreYOLO("LibreYOLO9t") builds an untrained network; LibreYOLO("path/best.pt") loads one.

    Nothing is ever downloaded: "LibreYOLO9t.pt" must exist on disk (or pass pretrained=False). A weights file may be
    this project's checkpoint or a foreign one (LibreYOLO 1.6, official YOLOX, torchvision: docs/weights.md);
    pretrained="file" with a model name builds that model and starts its training from the file."""

    family: Family
    size: str
    names: list[str]

    def __init__(
        self,
        model: str | os.PathLike[str] = "LibreYOLO9t",
        nc: int = 80,
        names: list[str] | None = None,
        pretrained: bool | str | os.PathLike[str] = True,
    ):
        self.source = str(model)
        self._net: nn.Module | None = None  # a name's network is built on first use: train() builds its own instead
        self.trained = False  # False: random init, which train() may rebuild under its seed
        self.metrics: dict[str, float] = {}
        self.imgsz = 640
        self.loaded_note = ""  # what a foreign weights file held (weights.load's one line)
        self.pretrained = None if isinstance(pretrained, bool) else Path(pretrained)  # train()'s starting weights
        path = Path(self.source)
        self.exported: Any = None  # an exported graph's metadata (libreyolo/export): predict and val run the graph
        if path.suffix in EXPORTED_SUFFIXES:
            from libreyolo.export.runtime import load_exported

            load_exported(self, path)
            return
        is_weights = path.suffix in WEIGHT_SUFFIXES
        stem_match = parse_model_name(path.stem if is_weights else self.source)
        if is_weights and (path.is_file() or pretrained is True or stem_match is None):
            self.load_record(read_weights(path))  # a missing file: where such weights are published
            return
        if stem_match is None and path.is_file():  # a checkpoint under another name, or a file that is not one
            self.load_record(read_weights(path))
            return
        if stem_match is None:
            raise ConfigError(
                f"model={self.source!r} is neither a known model name ({', '.join(model_names())}) nor a .pt file"
            )
        self.family, self.size = stem_match
        self.names = list(names) if names else [f"class{i}" for i in range(nc)]

    @property
    def net(self) -> nn.Module:
        if self._net is None:
            self._net = self.family.build(self.size, len(self.names))
        return self._net

    @net.setter
    def net(self, net: nn.Module) -> None:
        self._net = net

    # --- construction -------------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return f"{self.family.prefix}{self.size}"

    @property
    def nc(self) -> int:
        return len(self.names)

    def load_record(self, ckpt: dict[str, Any]) -> None:
        """Rebuild the network a checkpoint describes and load its weights (weights.load's record of a foreign file
        too: its note is printed)."""
        if ckpt.get("partial"):
            raise CheckpointError(f"{ckpt['note']}: part of a network only; pass it as pretrained= to a model")
        self.loaded_note = str(ckpt.get("note") or "")
        if self.loaded_note:
            print(self.loaded_note, flush=True)
        self.family = get_family(ckpt["family"])
        self.size, self.names = ckpt["size"], list(ckpt["names"])
        self.net = self.family.build(self.size, len(self.names))
        load_weights(self.net, ckpt["model"], f"checkpoint weights for {self.model_name}")
        self.imgsz = int(ckpt.get("imgsz", 640))
        self.metrics = dict(ckpt.get("metrics") or {})
        self.trained = True

    def prepare_for_training(self, names: list[str], fresh: bool = True) -> nn.Module:
        """An untrained model is rebuilt (under the run's seed) for the dataset's classes; a trained one keeps
        its weights, and if the class count differs, every tensor whose shape still fits is transferred. A new run
        (fresh) with pretrained=file starts from that file's weights the same way; freeze= then applies."""
        if fresh and not self.trained:
            self.names = list(names)
            self.net = self.family.build(self.size, len(names))
        elif list(names) != self.names:
            old = self.net.state_dict()
            self.names = list(names)
            self.net = self.family.build(self.size, len(names))
            print(transfer(self.net, old, f"{self.model_name} weights for {len(names)} classes"), flush=True)
        start = getattr(self, "_start", (None, 0))  # train()'s pretrained= file and freeze= value
        for line in start_from(self, start[0] if fresh else None, start[1]):
            print(line, flush=True)
        return self.net

    def save(self, path: str | os.PathLike[str]) -> Path:
        record = model_record(self.family.name, self.size, self.names, self.net.state_dict(), self.imgsz)
        return save_atomic(snapshot(record).resolve(), path)

    # --- actions ------------------------------------------------------------------------------------
    def train(self, data: str | None = None, **kwargs: Any) -> dict[str, float]:
        """Train; afterwards this object holds the best weights. Returns the best epoch's metrics."""
        if data is not None:
            kwargs["data"] = data
        kwargs.setdefault("model", self.source)
        if self.pretrained is not None:  # LibreYOLO(name, pretrained=file): a key of the run (DDP workers, args.yaml)
            kwargs.setdefault("pretrained", str(self.pretrained))
        cfg = TrainConfig.from_overrides(kwargs, family=self.family)
        # several GPUs outside torchrun: one process per GPU (launch.py), each running fit()
        from libreyolo.launch import spawn_ddp_train, spawn_plan

        plan = spawn_plan(cfg)
        if plan is not None:  # a worker's fit() explains its own out-of-memory error; the launcher re-raises
            # it as a DeviceMemoryError naming the rank, which passes through here
            with oom.explained(lambda: oom.train_spec(self, cfg, kwargs.get("batch"))):
                return spawn_ddp_train(self, kwargs, *plan)
        return self.fit(kwargs)

    def fit(self, kwargs: dict[str, Any]) -> dict[str, float]:
        """This process's part of a run, on the device the keys name: the whole run, or one rank's under torchrun
        or the spawn launcher (launch.py calls this in each worker). kwargs: train()'s keys, completed by it."""
        from libreyolo.engine.trainer import Trainer

        cfg = TrainConfig.from_overrides(kwargs, family=self.family)
        self._start = (cfg.pretrained if isinstance(cfg.pretrained, str) else None, cfg.freeze)  # for prepare_...
        trainer = Trainer(self, cfg, run_extensions(cfg))
        with oom.explained(lambda: oom.train_spec(self, trainer.cfg, kwargs.get("batch"))):
            metrics = trainer.train()
        self.adopt_run(trainer.s.run_dir, metrics)
        return metrics

    def adopt_run(self, run_dir: Path, metrics: dict[str, float]) -> None:
        """Take a finished run's best weights (its last if it never validated) and metrics."""
        weights = run_dir / "weights"
        best = weights / "best.pt" if (weights / "best.pt").exists() else weights / "last.pt"
        if best.exists():  # under multi-node torchrun, ranks on other nodes do not see rank 0's files
            self.load_record(load_checkpoint(best))
        self.metrics = metrics
        self.last_run = run_dir

    def val(self, data: str | None = None, **kwargs: Any) -> dict[str, Any]:
        from libreyolo.val import run_val

        with oom.explained(lambda: oom.val_spec(self, kwargs)):
            return run_val(self, data, **kwargs)

    def predict(
        self,
        source: Any,
        conf: float = 0.25,
        iou: float = 0.7,
        imgsz: int | None = None,
        device: str = "auto",
        max_det: int = 300,
        multi_label: bool | str = "auto",
        top_k: int = 5,
        stream: bool = False,
    ) -> Any:
        """Detect objects in images and videos: a path (image or video), a folder (both), a glob, a camera index
        or stream URL, a numpy array in OpenCV's channel order (gray, BGR or BGRA, uint8), a PIL image, or a list of
        them (libreyolo/sources). -> `Predictions`, a list of `Results` (one per readable image or frame) whose
        `skipped` lists the files that could not be read; stream=True: a `PredictStream` that yields them one frame
        at a time instead, holding only the frames of the batch being predicted (use it for videos and cameras).
        multi_label auto is false here (one class per box); val() uses true: pass the same value to both to
        reproduce val's mAP from these detections.
        A classifier returns `ClassResults` instead: its top-k classes and probabilities, k = top_k."""
        task = get_task(self.family.task).implementation()
        streaming = {"stream": True} if stream else {}  # a plug-in task's predict may not take it
        size = imgsz or self.imgsz
        return task.predict(self, source, conf, iou, size, device, max_det, multi_label, top_k, **streaming)

    def export(self, format: str = "onnx", **kwargs: Any) -> Path:
        """Write the network as an ONNX or TorchScript graph beside its weights (docs/export.md for the keys:
        imgsz, batch, dynamic, half, nms, opset, ...); -> the file's path."""
        from libreyolo.export.core import export_model

        return export_model(self, format=format, **kwargs)

    def __repr__(self) -> str:
        n = sum(p.numel() for p in self.net.parameters())
        state = "trained" if self.trained else "untrained"
        return f"LibreYOLO({self.model_name}, {self.nc} classes, {n / 1e6:.2f}M params, {state})"


def run_extensions(cfg: TrainConfig) -> list[OnStart]:
    """What a run attaches to its trainer: the experiment trackers (mlflow=true, wandb=true: a missing package is an
    error before the run starts; a resumed run's own keys decide), the profiler's window with profile=true (imported
    only then: profile=false costs nothing)."""
    from libreyolo import trackers

    trackers.require(cfg)
    if not cfg.profile:
        return [trackers.attach]
    from libreyolo.profiler import attach

    return [trackers.attach, attach]
