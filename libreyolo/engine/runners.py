"""Which step runner a run uses: `cuda_graph=auto|full|true|false` against what the family and the run allow.

auto, the default, captures as much as applies, without timing the modes: the whole-step graph (fullstep.py) where
the family's capture plan allows it and the run is one CUDA process, the network graph (netgraph.py) where only the
network can be captured, eager otherwise (CPU, MPS, Gloo). That was the fastest mode in most sizes measured; for
some of the largest, eager measured faster (docs/performance.md, "Every size against LibreYOLO 1.6 and
Ultralytics"). An explicit true/full that cannot apply falls back to eager with one `graph` event saying why, as
before; `full` for a family that can only capture its network (or parts of it: RT-DETR's host-side matching) falls
back to `true`, with one event naming the family's reason.

Under DDP over NCCL the graphs apply as in one process: the step keeps flat gradients and averages them with one
all-reduce (distributed/context.py grad_reducer), which the whole-step graph captures and the network graph runs
after its backward replay. NCCL can be captured from 2.9.6 on; Gloo collectives cannot."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from libreyolo import events as ev
from libreyolo.engine.fullstep import FullGraphStep
from libreyolo.engine.netgraph import NetworkGraphStep
from libreyolo.engine.step import EagerStep, StepRunner
from libreyolo.errors import ConfigError

if TYPE_CHECKING:
    from libreyolo.config import TrainConfig
    from libreyolo.engine.components import StepParts
    from libreyolo.families import Family

NAMES = {"full": "full", True: "true", False: "false"}  # the mode as the cuda_graph key spells it


NCCL_CAPTURE = (2, 9, 6)  # the first NCCL whose collectives a CUDA graph can capture


def graph_mode(
    setting: bool | str,
    family: Family,
    device: torch.device,
    world_size: int,
    backend: str | None = None,
    nccl: tuple[int, ...] | None = None,
) -> tuple[bool | str, str]:
    """-> (the mode the run uses: "full", True or False; one line saying why). backend is the process group's
    (None: not distributed), nccl the NCCL version torch was built with. An explicit true/full under DDP with an
    NCCL too old to capture collectives is a ConfigError: that run cannot do what was asked."""
    asked = "auto" if setting == "auto" else NAMES[setting]
    if setting is False:
        return False, "cuda_graph=false: training eager"
    plan = family.capture
    blocker = None
    if device.type != "cuda":
        blocker = f"CUDA graphs need a CUDA device; training eager on {device.type}"
    elif backend is not None and backend != "nccl":
        blocker = f"CUDA graphs under DDP need the NCCL backend (this run uses {backend}); training eager"
    elif backend == "nccl" and nccl is not None and tuple(nccl) < NCCL_CAPTURE:
        need = (
            f"a CUDA graph can capture NCCL collectives from NCCL {'.'.join(map(str, NCCL_CAPTURE))} on; this "
            f"torch has NCCL {'.'.join(map(str, nccl))}"
        )
        if setting != "auto":
            raise ConfigError(
                f"cuda_graph={asked} under DDP: {need}. Set cuda_graph=false (DDP trains eager), or install a torch "
                "built with a newer NCCL"
            )
        blocker = f"{need}; training eager"
    elif not plan:
        blocker = f"the {family.name} family has no capture plan; training eager"
    if blocker:
        return False, f"cuda_graph={asked}: {blocker}"
    under = f" under DDP ({world_size} process{'es' if world_size > 1 else ''}, NCCL)" if backend else ""
    if setting == "auto":
        if plan.full_step:
            where = "the gradient all-reduce inside the graph" if backend else "one CUDA process"
            return "full", f"cuda_graph=auto: the whole step in one graph{under} ({family.name} supports it; {where})"
        return True, f"cuda_graph=auto: the network in a graph{under} ({family.name} cannot capture its whole step)"
    if setting == "full" and not plan.full_step:
        why = plan.why_not_full or f"the {family.name} family does not support whole-step capture"
        return True, f"cuda_graph=full: {why}; the network in a graph instead (cuda_graph=true)"
    return setting, f"cuda_graph={asked}: " + (
        "the whole step in one graph" if setting == "full" else "the network in a graph"
    ) + under


def select_step(
    eager: EagerStep,
    parts: StepParts,
    cfg: TrainConfig,
    family: Family,
    device: torch.device,
    world_size: int,
    emit: Callable[[ev.Event], None],
    backend: str | None = None,
    nccl: tuple[int, ...] | None = None,
    capacity: int | None = None,
    decided: tuple[bool | str, str] | None = None,
) -> tuple[StepRunner, bool | str, str]:
    """-> (the step runner, the mode it runs, why). An explicit mode that cannot apply also emits one
    `graph` fallback event (auto's choice is reported by run_start). capacity: the whole-step graph's target
    capacity, known from the label scan (data/dataset.py capacity_bound); under DDP it is fixed for the run (every
    rank must capture and replay the same graphs, so no rank may raise it on its own). decided: graph_mode's answer,
    where the caller has it already. The whole step steps down to the network graph of the family's plan if its
    capture fails."""
    mode, reason = decided or graph_mode(cfg.cuda_graph, family, device, world_size, backend, nccl)
    if mode is False:
        if cfg.cuda_graph not in (False, "auto"):
            emit(ev.Graph(action="fallback", mode="full" if cfg.cuda_graph == "full" else "network", reason=reason))
        return eager, False, reason

    def network() -> NetworkGraphStep:
        return NetworkGraphStep(eager, emit, device, family.capture)

    if mode == "full":
        fixed = backend is not None and capacity is not None
        return FullGraphStep(eager, parts, cfg, emit, device, capacity, fixed, network), mode, reason
    if cfg.cuda_graph == "full":  # the family's plan allows the network graph only: one line saying why
        emit(ev.Graph(action="fallback", mode="full", reason=reason))
    return network(), mode, reason
