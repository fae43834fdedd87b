"""The new-run form's model: which keys it offers, their defaults, and the `libreyolo train` command they make.

Every key is a TrainConfig key and every value goes through the CLI's own parser (`parse_kv`), so the form
can never offer an option, or accept a value, that `libreyolo train` would not."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from libreyolo.api import DEMO_SETTINGS, LibreYOLOError, TrainConfig, is_builtin, parse_kv

# The keys the form shows, in order; anything else goes into the "more" field as key=value.
FORM_KEYS = (
    "model",
    "data",
    "epochs",
    "batch",
    "imgsz",
    "device",
    "amp",
    "amp_dtype",
    "cuda_graph",
    "profile",
    "workers",
    "cache",
)
# The keys the console sets itself so it knows the run folder in advance.
CONSOLE_KEYS = ("project", "name", "exist_ok")

# Choices for the keys that are a closed set (on/off keys are spelled out as words: readable without
# colour); tests check that each one parses with the CLI's parser.
CHOICES: dict[str, tuple[str, ...]] = {
    "amp": ("true", "false"),
    "amp_dtype": ("float16", "bfloat16"),
    "cuda_graph": ("auto", "false", "true", "full"),  # auto, the default, first
    "profile": ("false", "true"),
    "cache": ("auto", "false", "ram", "disk"),  # auto, the default, first
}

# the defaults and help of `libreyolo train` itself (a family's own key never shadows a shared one)
_SPEC: dict[str, tuple[Any, str]] = {}
for _key, _default, _help, _group in TrainConfig.spec():
    _SPEC.setdefault(_key, (_default, _help))
assert set(FORM_KEYS) <= set(_SPEC), "the form offers a key that `libreyolo train` lacks"


def help_for(key: str) -> str:
    return _SPEC[key][1]


def show(key: str, value: Any) -> str:
    """A config value as the form displays it and the command line spells it."""
    if key == "workers" and value is None:
        return "auto"
    if key == "batch" and value == -1:
        return "auto"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def is_builtin_data(data: str) -> bool:
    return is_builtin(data.strip())


def defaults(data: str = "shapes") -> dict[str, str]:
    """What `libreyolo train` uses for each form key when it is not given, for this dataset: the built-in
    dataset suggests its own epochs, imgsz and batch (libreyolo.data.shapes.DEMO_SETTINGS)."""
    out = {k: show(k, _SPEC[k][0]) for k in FORM_KEYS}
    if is_builtin_data(data):
        out.update({k: show(k, v) for k, v in DEMO_SETTINGS.items() if k in out})
    return out


def _spelled(key: str, text: str) -> str:
    """The form's words to the CLI's: "auto" batch is -1; "auto" workers is what the CLI calls auto."""
    text = text.strip()
    if key == "batch" and text.lower() == "auto":
        return "-1"
    return text


def build_args(values: dict[str, str], more: str = "") -> list[str]:
    """The key=value arguments for `libreyolo train`: only the keys whose value differs from what the
    trainer would use anyway, so the demo is just `libreyolo train`. Raises ConfigError naming the key."""
    base = defaults(values.get("data", "shapes") or "shapes")
    args: list[str] = []
    for key in FORM_KEYS:
        text = _spelled(key, values.get(key, base[key]))
        if not text:
            raise LibreYOLOError(f"{key} is empty; the default is {base[key]}")
        parsed = parse_kv([f"{key}={text}"])[key]  # the CLI's own check: raises ConfigError naming key and value
        if show(key, parsed) != base[key]:
            args.append(f"{key}={text}")
    extra = shlex.split(more)
    parsed_extra = parse_kv(extra)
    for key in parsed_extra:
        if key in FORM_KEYS:
            raise LibreYOLOError(f"{key} is set twice: in the form and in 'more' ({key}=...); keep one")
        if key in CONSOLE_KEYS:
            raise LibreYOLOError(
                f"{key} is chosen by the console (it picks the run folder under --project); remove {key}=..."
            )
    return args + extra


def command_line(args: list[str]) -> str:
    """The command a person would type: copy it to run the same training without the console."""
    return " ".join(["libreyolo", "train", *(shlex.quote(a) for a in args)])


def check_data(data: str) -> str | None:
    """None if `data` can be trained on, else what is wrong with it (read before the run is started)."""
    data = data.strip()
    if is_builtin_data(data):
        return None
    from libreyolo.api import load_data_config

    try:
        load_data_config(data)
    except LibreYOLOError as e:
        return str(e)
    return None


def check_model(model: str) -> str | None:
    """None if `model` names a model or an existing checkpoint."""
    from libreyolo.api import model_names, parse_model_name

    model = model.strip()
    if parse_model_name(model) is not None or Path(model).expanduser().is_file():
        return None
    if model.endswith(".pt"):
        return f"model={model}: the checkpoint does not exist"
    return f"model={model}: not a model name ({', '.join(model_names())}) or an existing .pt file"
