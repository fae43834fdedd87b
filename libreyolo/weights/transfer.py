"""Starting a network from weights made for another class count (pretrained=), and freezing part of it (freeze=)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libreyolo.errors import ConfigError
from libreyolo.families.built import BuiltModel
from libreyolo.weights import load


def start_from(model: BuiltModel, path: Any, freeze_value: Any) -> list[str]:
    """A new run's start (LibreYOLO.prepare_for_training): the network takes what fits of the pretrained= file (a
    path or None), then freeze= applies. -> the lines saying what was read, loaded and frozen."""
    lines = []
    if path is not None:
        record = load(path, family=model.family)
        held = f"{record['family']} {record['size']}"
        if record["family"] != model.family.name or (record["size"] != model.size and not record.get("partial")):
            raise ConfigError(
                f"pretrained={path} holds weights of {held}, not of {model.model_name}: pass model={path} to train the "
                "network it holds"
            )
        if record["note"]:
            lines.append(record["note"])
        lines.append(transfer(model.net, record["model"], f"pretrained={path}"))
    line = freeze(model.net, freeze_value, model.family.backbone)
    return lines + ([line] if line else [])


def transfer(net: nn.Module, state: dict[str, torch.Tensor], what: str) -> str:
    """Load every tensor of `state` whose name and shape the network has; the rest of the network keeps its fresh
    initialisation (the class-dependent head layers when the class count differs). -> the line saying how many
    tensors were loaded, re-initialised and ignored. what: the weights' source, for that line."""
    own = net.state_dict()
    fits = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    ignored = [k for k in state if k not in own and not k.endswith("num_batches_tracked")]  # no such tensor here
    reinit = [k for k in own if k not in fits]
    own.update(fits)
    net.load_state_dict(own)
    line = f"{what}: {len(fits)} tensors loaded, {len(reinit)} re-initialised, {len(ignored)} ignored"
    if reinit:
        line += f" (re-initialised: {_sample(reinit)})"
    return line


def _sample(keys: list[str], n: int = 3) -> str:
    return ", ".join(keys[:n]) + (f" and {len(keys) - n} more" if len(keys) > n else "")


def freeze(net: nn.Module, value: Any, backbone: tuple[str, ...]) -> str:
    """freeze=N: the network's first N top-level modules that hold parameters stop learning (requires_grad False;
    their BatchNorm statistics still follow the data); freeze=backbone: the family's backbone modules (`backbone`,
    dotted name prefixes); 0 or false: nothing. -> the line saying what was frozen ("" for nothing)."""
    if value in (0, False, None, "", "0", "false"):
        return ""
    if value == "backbone":
        if not backbone:
            raise ConfigError(f"freeze=backbone: {type(net).__name__} declares no backbone; pass freeze=N instead")
        names = list(backbone)
    else:
        children = [n for n, m in net.named_children() if any(True for _ in m.parameters())]
        if not isinstance(value, int) or not 0 < value <= len(children):
            raise ConfigError(
                f"freeze={value!r}: backbone, or a count of top-level modules "
                f"(1..{len(children)}: {', '.join(children)})"
            )
        names = children[:value]
    frozen = total = 0
    for name, p in net.named_parameters():
        total += p.numel()
        if any(name == n or name.startswith(n + ".") for n in names):
            p.requires_grad_(False)
            frozen += p.numel()
    if frozen == 0:
        raise ConfigError(f"freeze={value!r} matched no parameter of {type(net).__name__} ({', '.join(names)})")
    return f"freeze={value}: {frozen:,} of {total:,} parameters frozen ({', '.join(names)})"
