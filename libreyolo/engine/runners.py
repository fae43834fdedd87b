"""Which step runner a run uses: `cuda_graph=auto|full|true|false` against what the family and the run allow.

auto, the default, is the fastest path that applies: the whole-step graph (fullstep.py) where the family's
capture plan allows it and the run is one CUDA process, the network graph (graphs.py) where only the
network can be captured, eager otherwise (CPU, MPS, DDP). An explicit true/full that cannot apply falls back
to eager with one `graph` event saying why, as before; `full` for a family that can only capture its network
(or parts of it: RT-DETR's host-side matching) falls back to `true`, with one event naming the family's reason."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from libreyolo import events as ev
from libreyolo.engine.fullstep import FullGraphStep
from libreyolo.engine.graphs import NetworkGraphStep
from libreyolo.engine.step import EagerStep, StepRunner

NAMES = {"full": "full", True: "true", False: "false"}  # the mode as the cuda_graph key spells it


def graph_mode(setting: bool | str, family: Any, device: torch.device, world_size: int) -> tuple[bool | str, str]:
    """-> (the mode the run uses: "full", True or False; one line saying why)."""
    asked = "auto" if setting == "auto" else NAMES[setting]
    if setting is False:
        return False, "cuda_graph=false: training eager"
    plan = family.capture
    blocker = None
    if device.type != "cuda":
        blocker = f"CUDA graphs need a CUDA device; training eager on {device.type}"
    elif world_size > 1:  # (also the only case without flat parameter storage, which both graph modes use)
        blocker = f"CUDA graphs are not used under DDP ({world_size} processes); training eager"
    elif not plan:
        blocker = f"the {family.name} family has no capture plan; training eager"
    if blocker:
        return False, f"cuda_graph={asked}: {blocker}"
    if setting == "auto":
        if plan.full_step:
            return "full", f"cuda_graph=auto: the whole step in one graph ({family.name} supports it, one CUDA process)"
        return True, f"cuda_graph=auto: the network in a graph ({family.name} cannot capture its whole step)"
    if setting == "full" and not plan.full_step:
        why = plan.why_not_full or f"the {family.name} family does not support whole-step capture"
        return True, f"cuda_graph=full: {why}; the network in a graph instead (cuda_graph=true)"
    return setting, f"cuda_graph={asked}: " + (
        "the whole step in one graph" if setting == "full" else "the network in a graph"
    )


def select_step(
    eager: EagerStep,
    parts: Any,
    cfg: Any,
    family: Any,
    device: torch.device,
    world_size: int,
    emit: Callable[[ev.Event], None],
) -> tuple[StepRunner, bool | str, str]:
    """-> (the step runner, the mode it runs, why). An explicit mode that cannot apply also emits one
    `graph` fallback event (auto's choice is reported by run_start)."""
    mode, reason = graph_mode(cfg.cuda_graph, family, device, world_size)
    if mode is False:
        if cfg.cuda_graph not in (False, "auto"):
            emit(ev.Graph(action="fallback", mode="full" if cfg.cuda_graph == "full" else "network", reason=reason))
        return eager, False, reason
    if mode == "full":
        return FullGraphStep(eager, parts, cfg, emit, device), mode, reason
    if cfg.cuda_graph == "full":  # the family's plan allows the network graph only: one line saying why
        emit(ev.Graph(action="fallback", mode="full", reason=reason))
    return NetworkGraphStep(eager, emit, device, family.capture), mode, reason
