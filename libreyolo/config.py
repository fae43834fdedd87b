"""TrainConfig: every hyperparameter once, with its default, its type and one line of help.

The CLI's key=value parsing, `libreyolo train --help`, docs/hyperparameters.md and the console's form are
generated from the table below plus each family's own keys (`Family.options`, e.g. YOLOv9's loss gains), which a
config holds in `family_args` and the family reads typed (`Family.options_of(cfg).box`). Families override shared
defaults through `Family.defaults`."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import yaml

from libreyolo import keys as K
from libreyolo.errors import ConfigError
from libreyolo.families import Family, family_keys, get_family, model_names_summary, parse_model_name


def opt(default: Any, parse: Callable[[Any], Any], help: str, group: str = "train", cli: bool = True) -> Any:
    return field(default=default, metadata={"parse": parse, "help": help, "group": group, "cli": cli})


@dataclass
class TrainConfig:
    # run
    model: str = opt(
        "LibreYOLO9t",
        K.text,
        # {models}: spec() fills in the registry's names, so a new family's folder is all it takes to be listed
        "model name ({models}: docs/families.md) or a weights file (.pt, .pth, .safetensors: ours or a foreign one, "
        "docs/weights.md)",
        "run",
    )
    data: str = opt(
        "shapes",
        K.text,
        "dataset yaml, or 'shapes' for the built-in synthetic dataset; a classifier also takes a folder holding "
        "train/<class>/ and val/<class>/ (its 'shapes' is the built-in crops)",
        "run",
    )
    epochs: int = opt(100, K.positive(K.integer), "number of training epochs", "run")
    batch: int = opt(16, K.batch, "global batch size (split over GPUs); -1 picks it from GPU memory", "run")
    imgsz: int = opt(640, K.imgsz, "training and validation image size (square, multiple of 32)", "run")
    device: str = opt("auto", K.device, "cpu, auto, mps, a GPU index (0), several (0,1) or cuda:N", "run")
    workers: int | None = opt(
        None, K.workers, "data loader worker processes; auto picks from CPUs, GPUs and batch", "run"
    )
    project: str = opt("runs/train", K.text, "folder holding the run folders", "run")
    name: str = opt("exp", K.text, "run folder name; exp, exp2, ... unless exist_ok", "run")
    exist_ok: bool = opt(False, K.boolean, "reuse an existing run folder instead of incrementing the name", "run")
    resume: bool | str = opt(False, K.resume, "true to continue the run's last.pt, or a path to a last.pt", "run")
    pretrained: bool | str = opt(
        True,
        K.resume,
        "a weights file to start from (this project's, LibreYOLO 1.6, official YOLOX, torchvision ResNet: "
        "docs/weights.md), loading every tensor that fits the model and its classes; true: load weights when model "
        "names a file; false: model=X.pt builds an untrained X",
        "run",
    )
    freeze: int | str = opt(
        0, K.freeze, "stop training the network's first N top-level modules, or its backbone (0: none)", "run"
    )
    seed: int = opt(0, K.integer, "random seed for weights, sampling and augmentation", "run")
    deterministic: bool = opt(False, K.boolean, "use deterministic algorithms (slower on GPU)", "run")
    cudnn_benchmark: bool | str = opt(
        "auto",
        K.bool_or("auto"),
        "let cuDNN time its algorithms for every new input shape: faster convolutions after seconds of timing at the "
        "start; auto: only for runs of 5,000+ steps (off when deterministic)",
        "run",
    )
    patience: int = opt(
        100, K.nonneg(K.integer), "stop after this many epochs without a better fitness (0: never)", "run"
    )
    val: bool = opt(True, K.boolean, "validate after every epoch", "run")
    plots: bool = opt(
        True,
        K.boolean,
        "write the run's pictures, drawn off the training loop (forked child processes, side by side): results.png, "
        "PR/F1/P/R curves, confusion matrices, labels.jpg, training and validation mosaics (docs/quickstart.md); "
        'charts need pip install "libreyolo[plots]"',
        "run",
    )
    tensorboard: bool = opt(
        False,
        K.boolean,
        "write TensorBoard scalars (losses, metrics, LR, img/s, GPU memory) to run_dir/tensorboard/; "
        'needs pip install "libreyolo[tensorboard]"',
        "run",
    )
    mlflow: bool = opt(
        False,
        K.boolean,
        "log params, per-epoch metrics, the run's plots and best.pt to MLflow: the server MLFLOW_TRACKING_URI names, "
        'else a file store in ./mlruns; needs pip install "libreyolo[mlflow]" (docs/trackers.md)',
        "run",
    )
    wandb: bool = opt(
        False,
        K.boolean,
        "log the same to Weights & Biases, offline (wandb sync later) where there is no network or API key; "
        'needs pip install "libreyolo[wandb]"',
        "run",
    )
    save_period: int = opt(-1, K.integer, "also save weights/epochN.pt every N epochs (-1: never)", "run")
    cache: bool | str = opt(
        "auto",
        K.bool_or("ram", "disk", "auto", true_means="ram"),
        "cache decoded images: auto (in RAM as the loader first decodes them, if they fit in a quarter of the "
        "memory), ram (all before training), disk, or false",
        "run",
    )
    allow_empty: bool = opt(
        False,
        K.boolean,
        "train even if no training image has a box (labels folder missing or misnamed); refused otherwise",
        "run",
    )
    # optimisation
    optimizer: str = opt(
        "auto",
        K.choice("auto", "SGD", "AdamW"),
        "optimizer; auto: AdamW at an LR fitted to the class count, SGD at 0.01 beyond 10,000 optimizer steps (both "
        "ignore lr0 and momentum)",
        "optim",
    )
    lr0: float = opt(0.01, K.positive(K.number), "initial learning rate", "optim")
    lrf: float = opt(0.01, K.positive(K.number), "final learning rate as a fraction of lr0", "optim")
    cos_lr: bool = opt(False, K.boolean, "cosine instead of linear learning-rate decay", "optim")
    momentum: float = opt(0.937, K.nonneg(K.number), "SGD momentum / AdamW beta1", "optim")
    weight_decay: float = opt(0.0005, K.nonneg(K.number), "weight decay (scaled by batch*accumulate/nbs)", "optim")
    warmup_epochs: float = opt(3.0, K.nonneg(K.number), "warm-up length in epochs (at least 100 steps)", "optim")
    warmup_momentum: float = opt(0.8, K.nonneg(K.number), "momentum at the start of warm-up", "optim")
    warmup_bias_lr: float = opt(0.1, K.nonneg(K.number), "bias learning rate at the start of warm-up", "optim")
    nbs: int | str = opt(
        "auto",
        K.positive_or_auto(K.integer),
        "nominal batch size: gradients accumulate to about this many images; auto: 64 for long runs (over 10,000 "
        "optimizer steps at 64), the batch itself (a step per batch) for shorter ones",
        "optim",
    )
    grad_clip: float = opt(10.0, K.nonneg(K.number), "clip the gradient norm to this value (0: off)", "optim")
    ema: bool = opt(
        True, K.boolean, "keep an exponential moving average of the weights for val and checkpoints", "optim"
    )
    ema_decay: float = opt(0.9999, K.positive(K.number), "EMA decay d in d*(1-exp(-updates/ema_tau))", "optim")
    ema_tau: float = opt(2000.0, K.positive(K.number), "EMA warm-up constant in updates", "optim")
    # augmentation
    mosaic: float = opt(1.0, K.nonneg(K.number), "probability of a 4-image mosaic", "augment")
    no_aug_epochs: int = opt(15, K.nonneg(K.integer), "train the last N epochs without mosaic", "augment")
    degrees: float = opt(0.0, K.nonneg(K.number), "random rotation range (+/- degrees)", "augment")
    translate: float = opt(0.1, K.nonneg(K.number), "random translation (+/- fraction of image size)", "augment")
    scale: float = opt(0.5, K.nonneg(K.number), "random scale gain (+/- fraction)", "augment")
    shear: float = opt(0.0, K.nonneg(K.number), "random shear (+/- degrees)", "augment")
    fliplr: float = opt(0.5, K.nonneg(K.number), "probability of a horizontal flip", "augment")
    flipud: float = opt(0.0, K.nonneg(K.number), "probability of a vertical flip", "augment")
    hsv_h: float = opt(0.015, K.nonneg(K.number), "hue jitter (fraction)", "augment")
    hsv_s: float = opt(0.7, K.nonneg(K.number), "saturation jitter (fraction)", "augment")
    hsv_v: float = opt(0.4, K.nonneg(K.number), "value jitter (fraction)", "augment")
    # performance
    amp: bool = opt(True, K.boolean, "mixed precision on CUDA (off on CPU)", "speed")
    amp_dtype: str = opt(
        "float16",
        K.choice("float16", "bfloat16", aliases={"fp16": "float16", "bf16": "bfloat16", "half": "float16"}),
        "autocast dtype: float16 (with a loss scaler) or bfloat16",
        "speed",
    )
    cuda_graph: bool | str = opt(
        "auto",
        K.bool_or("full", "auto"),
        "CUDA graphs: auto (the whole step where the family and run allow it, else the network, else none), full (the "
        "whole step), true (the network), false",
        "speed",
    )
    overlap_backward: bool = opt(
        True,
        K.boolean,
        "eager steps on CUDA with accumulation: each micro-step's backward runs beside the next forward (the host is "
        "the limit there); two micro-steps' activations are then in memory at once",
        "speed",
    )
    channels_last: bool = opt(
        True, K.boolean, "channels-last memory format on CUDA (NHWC cuDNN kernels, no layout transposes)", "speed"
    )
    sync_bn: bool = opt(True, K.boolean, "convert BatchNorm to SyncBatchNorm under DDP", "speed")
    log_interval: float = opt(
        0.5, K.positive(K.number), "seconds between step events (losses are read asynchronously)", "speed"
    )
    # profiler
    profile: bool = opt(False, K.boolean, "profile a window of real steps, print a verdict, write artifacts", "profile")
    profile_warmup: int = opt(5, K.nonneg(K.integer), "steps discarded before the profiled window", "profile")
    profile_steps: int = opt(20, K.positive(K.integer), "steps in the profiled window", "profile")
    # validation / prediction
    conf: float = opt(0.001, K.fraction, "confidence threshold, 0..1 (0.001 for val, use 0.25 for predict)", "val")
    iou: float = opt(0.7, K.fraction, "NMS IoU threshold, 0..1", "val")
    max_det: int = opt(300, K.positive(K.integer), "maximum detections per image", "val")
    multi_label: bool | str = opt(
        "auto",
        K.bool_or("auto"),
        "NMS keeps every class above conf for a box (true) or only its best class (false); "
        "auto, as Ultralytics: true in validation (mAP), false in predict",
        "val",
    )
    # Python only
    callbacks: list = field(
        default_factory=list,
        metadata={"parse": None, "help": "callables that receive every event", "group": "python", "cli": False},
    )
    # the model family's own keys (Family.options): its name, and the values by key name, which the family reads
    # typed through Family.options_of(cfg)
    family: str | None = field(
        default=None, metadata={"parse": None, "help": "", "group": "python", "cli": False, "internal": True}
    )
    family_args: dict = field(
        default_factory=dict, metadata={"parse": None, "help": "", "group": "python", "cli": False, "internal": True}
    )
    # the keys the user gave (from_overrides' overrides): a dataset's suggestions fill only the others, and a resumed
    # run takes only these from the command line over its checkpoint's
    user_keys: frozenset[str] = field(
        default_factory=frozenset,
        metadata={"parse": None, "help": "", "group": "python", "cli": False, "internal": True},
    )

    def set(self, key: str, value: Any) -> None:
        """Set a key, TrainConfig's own or the family's, already typed."""
        if key in _FIELDS:
            setattr(self, key, value)
        else:
            self.family_args[key] = value

    def get(self, key: str) -> Any:
        """A key's value, TrainConfig's own or the family's (KeyError for neither)."""
        return getattr(self, key) if key in _FIELDS else self.family_args[key]

    @classmethod
    def keys(cls) -> list[str]:
        """TrainConfig's own command-line keys (without any family's)."""
        return [f.name for f in fields(cls) if f.metadata.get("cli", True)]

    @classmethod
    def all_keys(cls) -> list[str]:
        """Every key the command line accepts: TrainConfig's own and every family's."""
        return cls.keys() + [k for k in family_keys() if k not in _FIELDS]

    @classmethod
    def spec(cls, family: Family | None = None) -> list[tuple[str, Any, str, str]]:
        """(key, default, help, group) for every command-line key, in declaration order. With a family: its
        defaults, then its own keys (group "family:<name>"); without: every family's keys, family by family."""
        out = []
        over = family.defaults if family is not None else {}
        for f in fields(cls):
            if f.metadata.get("cli", True):
                help_ = f.metadata["help"].replace("{models}", model_names_summary())
                out.append((f.name, over.get(f.name, f.default), help_, f.metadata["group"]))
        owners = [family] if family is not None else _families()
        for fam in owners:
            out += [(k.name, fam.defaults.get(k.name, k.default), k.help, f"family:{fam.name}") for k in fam.keys]
        return out

    @classmethod
    def parse_value(cls, key: str, value: Any, family: Family | None = None) -> Any:
        """Type one value; errors name the key, the value and what is accepted. A family's key needs that
        family (or no family given); another family's key is an error naming the family that has it."""
        spec = _FIELDS.get(key)
        if spec is not None and not spec.metadata.get("internal"):
            parse = spec.metadata["parse"]
        else:
            owners = family_keys().get(key, [])
            if not owners:
                raise ConfigError(unknown_key_message(key, cls.all_keys()))
            mine = [k for f, k in owners if family is None or f.name == family.name]
            if not mine:
                names = ", ".join(f"the {f.name} family ({', '.join(f.models)})" for f, _ in owners)
                raise ConfigError(
                    f"{key} is a key of {names}; {family.name} models ({', '.join(family.models)}) do not take it. "
                    f"Remove {key}=..."
                )
            parse = mine[0].parse
        if parse is None:
            return value
        try:
            return parse(value)
        except ValueError as e:
            raise ConfigError(f"{key}={value!r} is not valid: {key} takes {e}") from None

    @classmethod
    def from_overrides(
        cls, overrides: dict[str, Any], defaults: dict[str, Any] | None = None, family: Family | None = None
    ) -> TrainConfig:
        """The family's key defaults, its `defaults`, then `defaults`, then the user's values; every value is typed
        and checked. The family is the one given, else the one `model` names (a .pt file names none: its
        caller passes the checkpoint's family)."""
        if family is None:
            hit = parse_model_name(str(overrides.get("model", _FIELDS["model"].default)))
            family = hit[0] if hit else None
        cfg = cls()
        if family is not None:
            cfg.family = family.name
            cfg.family_args = {k.name: k.default for k in family.keys}
        for k, v in {**(family.defaults if family else {}), **(defaults or {}), **overrides}.items():
            cfg.set(k, cls.parse_value(k, v, family))
        cfg.user_keys = frozenset(overrides)
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self.keys()}, **self.family_args}

    def fill_unset(self, suggested: dict[str, Any]) -> None:
        """A dataset's suggestions (e.g. the built-in one's imgsz, epochs) for the keys the user did not set."""
        fam = get_family(self.family) if self.family else None
        for k, v in suggested.items():
            if k not in self.user_keys:
                self.set(k, self.parse_value(k, v, fam))


_FIELDS = {f.name: f for f in fields(TrainConfig)}


def _families() -> list[Family]:
    from libreyolo.families import families

    return list(families().values())


def unknown_key_message(key: str, valid: list[str], command: str = "train") -> str:
    """Names the key, the nearest valid ones, and the --help of the command that was run."""
    near = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(near)}?" if near else ""
    return f"unknown key {key!r}.{hint} See `libreyolo {command} --help` for every key."


def resolve_multi_label(value: bool | str, mode: str) -> bool:
    """The multi_label key for `mode` ("val" or "predict"): auto is true in validation and false in predict."""
    return mode == "val" if value == "auto" else bool(value)


def parse_kv(
    argv: list[str], allowed: set[str] | None = None, extra: dict[str, Any] | None = None, command: str = "train"
) -> dict[str, Any]:
    """['epochs=3', 'device=0,1'] -> {'epochs': 3, 'device': '0,1'}. Values are YAML-ish scalars; keys must
    be TrainConfig keys or a family's keys (optionally restricted to `allowed`) or one of `extra` (name ->
    parser). Whether a family key suits the model is checked when the run's config is made. Errors point to
    `libreyolo <command> --help`."""
    extra = extra or {}
    valid = sorted((allowed if allowed is not None else set(TrainConfig.all_keys())) | set(extra))
    out: dict[str, Any] = {}
    for arg in argv:
        if "=" not in arg:
            raise ConfigError(
                f"argument {arg!r} is not key=value (for example {'epochs=10' if command == 'train' else 'conf=0.5'}). "
                f"See `libreyolo {command} --help`."
            )
        key, value = arg.split("=", 1)
        key = key.strip().lstrip("-").replace("-", "_")
        if key not in valid:
            raise ConfigError(unknown_key_message(key, valid, command))
        if key in extra:
            try:
                out[key] = extra[key](value)
            except ValueError as e:  # bad values of command keys are named like TrainConfig's
                raise ConfigError(f"{key}={value!r} is not valid: {key} takes {e}") from None
        else:
            out[key] = TrainConfig.parse_value(key, _scalar(value))
    return out


def _scalar(v: str) -> Any:
    """'0,1' stays a string (a device list); '[0, 1]' becomes a list; numbers and booleans stay text for the
    typed parser, which knows what each key accepts."""
    s = v.strip()
    if s.startswith("[") and s.endswith("]"):
        try:
            return yaml.safe_load(s)
        except yaml.YAMLError:
            return s
    return s
