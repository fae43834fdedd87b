"""TrainConfig: every hyperparameter once, with its default, its type and one line of help.

The CLI's key=value parsing, `libreyolo train --help` and docs/hyperparameters.md are generated from
the table below; families override defaults through `Family.defaults`."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from libreyolo.errors import ConfigError

_TRUE = {"true", "1", "yes", "on", "y", "t"}
_FALSE = {"false", "0", "no", "off", "n", "f"}


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
        return v.strip().lower() in _TRUE
    raise ValueError("a boolean (true/false)")


def _int(v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError("an integer")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError("an integer") from None
    if f != int(f):
        raise ValueError("an integer")
    return int(f)


def _float(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError("a number")
    try:
        return float(v)
    except (TypeError, ValueError):
        raise ValueError("a number") from None


def _str(v: Any) -> str:
    if v is None:
        raise ValueError("a string")
    return str(v)


def _opt_str(v: Any) -> str | None:
    return None if v is None or (isinstance(v, str) and v.lower() in ("", "none", "null")) else str(v)


def _choice(*options: str, aliases: dict[str, str] | None = None) -> Callable[[Any], str]:
    aliases = aliases or {}

    def parse(v: Any) -> str:
        s = str(v).strip()
        s = aliases.get(s.lower(), s)
        for o in options:
            if s.lower() == o.lower():
                return o
        raise ValueError("one of " + ", ".join(options + tuple(aliases)))

    return parse


def _bool_or(*options: str, true_means: str | None = None) -> Callable[[Any], bool | str]:
    """A flag that is also one of a few named modes (cache=ram, cuda_graph=full)."""

    def parse(v: Any) -> bool | str:
        if isinstance(v, str) and v.strip().lower() in options:
            return v.strip().lower()
        try:
            b = _bool(v)
        except ValueError:
            raise ValueError("true, false or one of " + ", ".join(options)) from None
        return true_means if (b and true_means) else b

    return parse


def _device(v: Any) -> str:
    """Normalise 'cpu', 0, '0,1', [0, 1], 'cuda:0', 'mps', 'auto' to a string; resolution happens later."""
    if isinstance(v, (list, tuple)):
        if not v:
            raise ValueError("cpu, auto, mps, a GPU index (0), a list (0,1) or cuda:N")
        return ",".join(str(_int(x)) for x in v)
    if isinstance(v, bool):
        raise ValueError("cpu, auto, mps, a GPU index (0), a list (0,1) or cuda:N")
    s = str(v).strip().strip("[]()").replace(" ", "").lower()
    if s in ("cpu", "auto", "mps", "cuda"):
        return s
    if s.startswith("cuda:") and s[5:].isdigit():
        return s[5:]
    parts = s.split(",")
    if parts and all(p.isdigit() for p in parts):
        return ",".join(parts)
    raise ValueError("cpu, auto, mps, a GPU index (0), a list (0,1) or cuda:N")


def _batch(v: Any) -> int:
    b = _int(v)
    if b == 0 or b < -1:
        raise ValueError("a positive integer, or -1 for autobatch")
    return b


def _positive(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def p(v: Any) -> Any:
        x = parse(v)
        if x <= 0:
            raise ValueError("a positive number")
        return x

    return p


def _nonneg(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def p(v: Any) -> Any:
        x = parse(v)
        if x < 0:
            raise ValueError("a number >= 0")
        return x

    return p


def _imgsz(v: Any) -> int:
    s = _int(v)
    if s < 32 or s % 32:
        raise ValueError("a multiple of 32, at least 32")
    return s


def _workers(v: Any) -> int | None:
    if v is None or (isinstance(v, str) and v.lower() in ("auto", "none", "")):
        return None
    w = _int(v)
    if w < 0:
        raise ValueError("an integer >= 0, or auto")
    return w


def _resume(v: Any) -> bool | str:
    if isinstance(v, str) and v.strip().lower() not in _TRUE | _FALSE:
        return v
    return _bool(v)


def opt(default: Any, parse: Callable[[Any], Any], help: str, group: str = "train", cli: bool = True) -> Any:
    return field(default=default, metadata={"parse": parse, "help": help, "group": group, "cli": cli})


@dataclass
class TrainConfig:
    # run
    model: str = opt("LibreYOLO9t", _str, "model name (LibreYOLO9t, LibreYOLO9s) or a checkpoint .pt", "run")
    data: str = opt("shapes", _str, "dataset yaml, or 'shapes' for the built-in synthetic dataset", "run")
    epochs: int = opt(100, _positive(_int), "number of training epochs", "run")
    batch: int = opt(16, _batch, "global batch size (split over GPUs); -1 picks it from GPU memory", "run")
    imgsz: int = opt(640, _imgsz, "training and validation image size (square, multiple of 32)", "run")
    device: str = opt("auto", _device, "cpu, auto, mps, a GPU index (0), several (0,1) or cuda:N", "run")
    workers: int | None = opt(None, _workers, "data loader worker processes; auto picks from CPUs, GPUs and batch", "run")
    project: str = opt("runs/train", _str, "folder holding the run folders", "run")
    name: str = opt("exp", _str, "run folder name; exp, exp2, ... unless exist_ok", "run")
    exist_ok: bool = opt(False, _bool, "reuse an existing run folder instead of incrementing the name", "run")
    resume: bool | str = opt(False, _resume, "true to continue the run's last.pt, or a path to a last.pt", "run")
    pretrained: bool = opt(True, _bool, "load weights when model names a .pt file; false builds the network untrained", "run")
    seed: int = opt(0, _int, "random seed for weights, sampling and augmentation", "run")
    deterministic: bool = opt(False, _bool, "use deterministic algorithms (slower on GPU)", "run")
    cudnn_benchmark: bool | str = opt("auto", _bool_or("auto"), "let cuDNN time its algorithms for every new input shape: faster convolutions after seconds of timing at the start; auto: only for runs of 5,000+ steps (off when deterministic)", "run")
    patience: int = opt(100, _nonneg(_int), "stop after this many epochs without a better fitness (0: never)", "run")
    val: bool = opt(True, _bool, "validate after every epoch", "run")
    save_period: int = opt(-1, _int, "also save weights/epochN.pt every N epochs (-1: never)", "run")
    cache: bool | str = opt(False, _bool_or("ram", "disk", "auto", true_means="ram"), "cache decoded images: ram, disk, auto (ram if it fits, else none) or false", "run")
    # optimisation
    optimizer: str = opt("auto", _choice("auto", "SGD", "AdamW"), "optimizer; auto: AdamW at an LR fitted to the class count, SGD at 0.01 beyond 10,000 optimizer steps (both ignore lr0 and momentum)", "optim")
    lr0: float = opt(0.01, _positive(_float), "initial learning rate", "optim")
    lrf: float = opt(0.01, _positive(_float), "final learning rate as a fraction of lr0", "optim")
    cos_lr: bool = opt(False, _bool, "cosine instead of linear learning-rate decay", "optim")
    momentum: float = opt(0.937, _nonneg(_float), "SGD momentum / AdamW beta1", "optim")
    weight_decay: float = opt(0.0005, _nonneg(_float), "weight decay (scaled by batch*accumulate/nbs)", "optim")
    warmup_epochs: float = opt(3.0, _nonneg(_float), "warm-up length in epochs (at least 100 steps)", "optim")
    warmup_momentum: float = opt(0.8, _nonneg(_float), "momentum at the start of warm-up", "optim")
    warmup_bias_lr: float = opt(0.1, _nonneg(_float), "bias learning rate at the start of warm-up", "optim")
    nbs: int = opt(64, _positive(_int), "nominal batch size: gradients accumulate to about this many images", "optim")
    grad_clip: float = opt(10.0, _nonneg(_float), "clip the gradient norm to this value (0: off)", "optim")
    ema: bool = opt(True, _bool, "keep an exponential moving average of the weights for val and checkpoints", "optim")
    ema_decay: float = opt(0.9999, _positive(_float), "EMA decay d in d*(1-exp(-updates/ema_tau))", "optim")
    ema_tau: float = opt(2000.0, _positive(_float), "EMA warm-up constant in updates", "optim")
    # loss
    box: float = opt(7.5, _nonneg(_float), "box (CIoU) loss gain", "loss")
    cls: float = opt(0.5, _nonneg(_float), "classification (BCE) loss gain", "loss")
    dfl: float = opt(1.5, _nonneg(_float), "distribution focal loss gain", "loss")
    aux: bool = opt(True, _bool, "train with the auxiliary PGI head (YOLOv9); never part of saved weights", "loss")
    aux_weight: float = opt(0.25, _nonneg(_float), "weight of the auxiliary head's loss", "loss")
    # augmentation
    mosaic: float = opt(1.0, _nonneg(_float), "probability of a 4-image mosaic", "augment")
    no_aug_epochs: int = opt(15, _nonneg(_int), "train the last N epochs without mosaic", "augment")
    degrees: float = opt(0.0, _nonneg(_float), "random rotation range (+/- degrees)", "augment")
    translate: float = opt(0.1, _nonneg(_float), "random translation (+/- fraction of image size)", "augment")
    scale: float = opt(0.5, _nonneg(_float), "random scale gain (+/- fraction)", "augment")
    shear: float = opt(0.0, _nonneg(_float), "random shear (+/- degrees)", "augment")
    fliplr: float = opt(0.5, _nonneg(_float), "probability of a horizontal flip", "augment")
    flipud: float = opt(0.0, _nonneg(_float), "probability of a vertical flip", "augment")
    hsv_h: float = opt(0.015, _nonneg(_float), "hue jitter (fraction)", "augment")
    hsv_s: float = opt(0.7, _nonneg(_float), "saturation jitter (fraction)", "augment")
    hsv_v: float = opt(0.4, _nonneg(_float), "value jitter (fraction)", "augment")
    # performance
    amp: bool = opt(True, _bool, "mixed precision on CUDA (off on CPU)", "speed")
    amp_dtype: str = opt("float16", _choice("float16", "bfloat16", aliases={"fp16": "float16", "bf16": "bfloat16", "half": "float16"}), "autocast dtype: float16 (with a loss scaler) or bfloat16", "speed")
    cuda_graph: bool | str = opt(False, _bool_or("full"), "capture the network (true) or the whole step (full) in a CUDA graph", "speed")
    channels_last: bool = opt(True, _bool, "channels-last memory format on CUDA (NHWC cuDNN kernels, no layout transposes)", "speed")
    sync_bn: bool = opt(True, _bool, "convert BatchNorm to SyncBatchNorm under DDP", "speed")
    log_interval: float = opt(0.5, _positive(_float), "seconds between step events (losses are read asynchronously)", "speed")
    # profiler
    profile: bool = opt(False, _bool, "profile a window of real steps, print a verdict, write artifacts", "profile")
    profile_warmup: int = opt(5, _nonneg(_int), "steps discarded before the profiled window", "profile")
    profile_steps: int = opt(20, _positive(_int), "steps in the profiled window", "profile")
    # validation / prediction
    conf: float = opt(0.001, _nonneg(_float), "confidence threshold (0.001 for val, use 0.25 for predict)", "val")
    iou: float = opt(0.7, _positive(_float), "NMS IoU threshold", "val")
    max_det: int = opt(300, _positive(_int), "maximum detections per image", "val")
    # Python only
    callbacks: list = field(default_factory=list, metadata={"parse": None, "help": "callables that receive every event", "group": "python", "cli": False})

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.metadata.get("cli", True)]

    @classmethod
    def spec(cls) -> list[tuple[str, Any, str, str]]:
        """(key, default, help, group) for every CLI key, in declaration order."""
        out = []
        for f in fields(cls):
            if f.metadata.get("cli", True):
                out.append((f.name, f.default, f.metadata["help"], f.metadata["group"]))
        return out

    @classmethod
    def parse_value(cls, key: str, value: Any) -> Any:
        """Type one value; errors name the key, the value and what is accepted."""
        spec = {f.name: f for f in fields(cls)}.get(key)
        if spec is None:
            raise ConfigError(unknown_key_message(key, cls.keys()))
        parse = spec.metadata["parse"]
        if parse is None:
            return value
        try:
            return parse(value)
        except ValueError as e:
            raise ConfigError(f"{key}={value!r} is not valid: {key} takes {e}") from None

    @classmethod
    def from_overrides(cls, overrides: dict[str, Any], defaults: dict[str, Any] | None = None) -> "TrainConfig":
        """Family defaults first, then the user's values; every value is typed and checked."""
        cfg = cls()
        for k, v in {**(defaults or {}), **overrides}.items():
            setattr(cfg, k, cls.parse_value(k, v))
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.keys()}

    def fill_unset(self, suggested: dict[str, Any], user_keys: set[str]) -> None:
        """A dataset's suggestions (e.g. the built-in one's imgsz, epochs) for the keys the user did not set."""
        for k, v in suggested.items():
            if k not in user_keys:
                setattr(self, k, self.parse_value(k, v))


def unknown_key_message(key: str, valid: list[str]) -> str:
    near = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(near)}?" if near else ""
    return f"unknown key {key!r}.{hint} See `libreyolo train --help` for every key."
