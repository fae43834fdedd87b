"""Out of device memory, said plainly: which run, what the failing allocation needed, what was free, who holds the
rest, and which setting to change.

torch's OutOfMemoryError is a long sentence about the caching allocator and ends a run with a traceback from deep
inside the setup or the step. The entry points (LibreYOLO.train/val, `profile run`, `bench step`) wrap their work in
`explained(...)`, which turns it into a DeviceMemoryError (a LibreYOLOError: the CLI prints one `error:` block and
exits 2) chained to torch's. The engine itself is not touched: the trainer still records torch's own error event and
saves nothing on this path, so a resumed run's last.pt stays as it was."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from libreyolo.errors import DeviceMemoryError, LibreYOLOError
from libreyolo.families.built import BuiltModel

if TYPE_CHECKING:
    from libreyolo.config import TrainConfig

GiB = 2**30

# torch's format_size writes binary units; MPS's message writes "MB"/"GB" for the same binary sizes
_UNITS = {"bytes": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_UNITS.update({"kb": 2**10, "mb": 2**20, "gb": 2**30, "tb": 2**40})
_SIZE = r"(\d+(?:\.\d+)?)\s*(bytes|TiB|GiB|MiB|KiB|TB|GB|MB|KB|B)\b"
_NEEDED = re.compile(r"Tried to allocate " + _SIZE)
_TOTAL = re.compile(r"\b(?:GPU|Device) (\d+) has a total capac\w* of " + _SIZE)
_FREE = re.compile(r"of which " + _SIZE + r"\s*is free")
_OTHER = re.compile(r"Process (\d+) has " + _SIZE + r" memory in use")
_SELF = re.compile(r"this process has " + _SIZE + r" memory in use")
_ALLOCATED = re.compile(_SIZE + r" is allocated by PyTorch")
_CACHED = re.compile(_SIZE + r" is reserved by PyTorch but unallocated")
_MPS = re.compile(r"MPS allocated: " + _SIZE + r", other allocations: " + _SIZE + r", max allowed: " + _SIZE)
# RuntimeErrors (AcceleratorError from torch 2.8) that are the same condition outside the caching allocator
_RAW_OOM = ("CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit.lower()])


@dataclass
class OomFacts:
    """What torch's message says (None where it does not), topped up from the device where one can be asked."""

    needed: int | None = None  # the failing allocation, rounded up by the allocator
    gpu: int | None = None  # torch's index of the device
    total: int | None = None
    free: int | None = None
    allocated: int | None = None  # this process's live tensors
    reserved: int | None = None  # this process's caching allocator: tensors plus cached blocks
    this_process: int | None = None  # NVML: all this process holds on the device, its CUDA context included
    others: list[dict[str, Any]] = field(default_factory=list)  # [{pid, name, used_mb}], largest first
    others_known: bool = False  # False: no NVML answer, so an empty `others` says nothing


def parse_oom(text: str) -> OomFacts:
    """The figures of a torch out-of-memory message; any part may be missing (older torch, MPS, a raw CUDA error)."""
    f = OomFacts()
    if m := _NEEDED.search(text):
        f.needed = _bytes(*m.groups())
    if m := _TOTAL.search(text):
        f.gpu, f.total = int(m.group(1)), _bytes(m.group(2), m.group(3))
    if m := _FREE.search(text):
        f.free = _bytes(*m.groups())
    if m := _SELF.search(text):
        f.this_process = _bytes(*m.groups())
    others = [(int(m.group(1)), _bytes(m.group(2), m.group(3))) for m in _OTHER.finditer(text)]
    if others:
        f.others = [{"pid": pid, "name": None, "used_mb": b / 2**20} for pid, b in sorted(others, key=lambda p: -p[1])]
        f.others_known = True
    if m := _ALLOCATED.search(text):
        f.allocated = _bytes(*m.groups())
        if c := _CACHED.search(text):
            f.reserved = f.allocated + _bytes(*c.groups())
    if m := _MPS.search(text):  # MPS: a watermark instead of a capacity; what is left under it is what was free
        ours, other, cap = _bytes(*m.groups()[0:2]), _bytes(*m.groups()[2:4]), _bytes(*m.groups()[4:6])
        f.allocated, f.total, f.free = ours, cap, max(cap - ours - other, 0)
    return f


def is_oom(err: BaseException) -> bool:
    if isinstance(err, LibreYOLOError):  # already explained (a DDP rank's, re-raised by the launcher)
        return False
    if isinstance(err, torch.OutOfMemoryError):
        return True
    return isinstance(err, RuntimeError) and any(s in str(err) for s in _RAW_OOM)


@dataclass(frozen=True)
class Flags:
    """How a command spells the settings the advice names."""

    batch: str = "batch={}"
    imgsz: str = "imgsz={}"
    autobatch: str | None = "batch=-1"  # None: the command has no autobatch
    device: str = "device=N"


KEYS = Flags()  # train, and the Python API
NO_AUTOBATCH = Flags(autobatch=None)  # val (batch=-1 is 16 there), bench step
PROFILE = Flags("--batch {}", "--imgsz {}", "--batch -1", "--device N")


@dataclass(frozen=True)
class RunSpec:
    """The run that ran out of memory, as the user set it."""

    action: str  # "training", "validating", ...
    model: str
    batch: int  # the global batch; -1 while autobatch had not picked one
    imgsz: int
    device: str  # the device setting; the message names the failing device itself when torch does
    autobatched: bool = False  # batch=-1 picked `batch`
    world_size: int = 1
    flags: Flags = KEYS
    resumed: str | None = None  # the last.pt a resumed run continues: its batch and imgsz cannot change


def train_spec(model: BuiltModel, cfg: TrainConfig, requested_batch: Any) -> RunSpec:
    """A LibreYOLO.train run from its TrainConfig: pass the trainer's, read when the run failed, which is the resumed
    run's once the setup has read the checkpoint and holds autobatch's pick once made."""
    world = int(os.environ.get("WORLD_SIZE") or 1)  # a DDP rank (torchrun or the spawn launcher's worker)
    autobatched = str(requested_batch).strip() == "-1" and cfg.batch != -1  # the API takes "-1" as the CLI does
    resumed = None if cfg.resume in (False, None, "") else str(cfg.resume)  # a path once the setup has resolved it
    return RunSpec(
        "training", model.model_name, int(cfg.batch), int(cfg.imgsz), str(cfg.device), autobatched, world, KEYS, resumed
    )


def val_spec(model: BuiltModel, kwargs: dict[str, Any]) -> RunSpec:
    from libreyolo.config import TrainConfig

    cfg = TrainConfig.from_overrides({"imgsz": model.imgsz, **kwargs}, family=model.family)
    batch = 16 if cfg.batch == -1 else cfg.batch  # as val.py: validation has no autobatch
    return RunSpec("validating", model.model_name, batch, int(cfg.imgsz), str(cfg.device), flags=NO_AUTOBATCH)


def config_spec(action: str, overrides: dict[str, Any], flags: Flags) -> RunSpec:
    """A run described by training keys (profile run, bench step), defaults filled in."""
    from libreyolo.config import TrainConfig

    cfg = TrainConfig.from_overrides(overrides)
    return RunSpec(action, str(cfg.model), int(cfg.batch), int(cfg.imgsz), str(cfg.device), flags=flags)


@contextlib.contextmanager
def explained(describe: Callable[[], RunSpec]) -> Iterator[None]:
    """Turn an out-of-memory error raised inside into a DeviceMemoryError that says what to do. `describe` is called
    only then, so it can read what the run resolved by the time it failed (autobatch's batch, a resume's config)."""
    try:
        yield
    except (torch.OutOfMemoryError, RuntimeError) as e:
        if not is_oom(e):
            raise
        try:
            spec: RunSpec | None = describe()
        except Exception:  # a description that cannot be made must not replace the error it describes
            spec = None
        try:
            text = explain(e, spec)
        except Exception:
            text = f"out of device memory: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        raise DeviceMemoryError(text) from e


def explain(err: BaseException, spec: RunSpec | None) -> str:
    """The message: one line saying what failed, then who holds the memory and what to change."""
    facts = parse_oom(str(err))
    device = _device(facts, spec)
    _top_up(facts, device)
    return "\n".join([_headline(facts, device, spec), *_holders(facts), *_advice(facts, spec, device)])


def _device(facts: OomFacts, spec: RunSpec | None) -> torch.device | None:
    if facts.gpu is not None:
        return torch.device("cuda", facts.gpu)
    if spec is not None and re.fullmatch(r"cuda:\d+|\d+", spec.device):
        return torch.device("cuda", int(spec.device.removeprefix("cuda:")))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return None


def _top_up(facts: OomFacts, device: torch.device | None) -> None:
    """Fill what the message left out from the device as it is now. The failing step's tensors are still referenced
    by the traceback, so this is close to the moment of failure; the message's own figures are preferred."""
    if device is None or device.type != "cuda" or not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return
    try:
        if facts.free is None or facts.total is None:
            free, total = torch.cuda.mem_get_info(device)
            facts.free = free if facts.free is None else facts.free
            facts.total = total if facts.total is None else facts.total
        if facts.reserved is None:
            facts.reserved = torch.cuda.memory_reserved(device)
            facts.allocated = torch.cuda.memory_allocated(device)
    except RuntimeError:  # a device whose context the failure broke: the message's figures are all there is
        pass
    from libreyolo.gpuprocs import other_processes

    try:
        procs = other_processes(device)
    except Exception:  # NVML's answer is a courtesy here
        procs = None
    if procs is not None:
        facts.others, facts.others_known = procs, True


def _size(b: float | None) -> str:
    if b is None:
        return "?"
    for unit, scale in (("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{int(b)} bytes"


def _headline(f: OomFacts, device: torch.device | None, spec: RunSpec | None) -> str:
    where = str(device) if device is not None else (f"device={spec.device}" if spec else "the device")
    head = f"out of memory on {where}"
    if spec is not None:
        batch = f"batch={spec.batch}" if spec.batch > 0 else "batch=-1 (autobatch had not picked one yet)"
        if spec.autobatched:
            batch += " (picked by autobatch)"
        if spec.world_size > 1 and spec.batch >= spec.world_size:
            batch += f" ({spec.batch // spec.world_size} per GPU x {spec.world_size})"
        head += f" while {spec.action} {spec.model} at {batch} imgsz={spec.imgsz}"
    of = f" of {_size(f.total)}" if f.total is not None else ""
    free = f" with {_size(f.free)}{of} free" if f.free is not None else ""
    if f.needed is not None:
        return f"{head}: an allocation of {_size(f.needed)} failed{free}."
    if f.free is not None:
        return f"{head}: {_size(f.free)}{of} was free."
    return f"{head}."


def _others_bytes(f: OomFacts) -> float:
    return sum(p["used_mb"] or 0.0 for p in f.others) * 2**20


def _proc(p: dict[str, Any]) -> str:
    name = f" ({p['name']})" if p["name"] else ""
    used = f" {_size(p['used_mb'] * 2**20)}" if p["used_mb"] is not None else ""
    return f"pid {p['pid']}{name}{used}"


def _holders(f: OomFacts) -> list[str]:
    lines = []
    ours = [f"{_size(f.reserved)} reserved by PyTorch"] if f.reserved is not None else []
    if f.allocated is not None and ours:
        ours.append(f"{_size(f.allocated)} of it in tensors")
    if f.this_process is not None:
        rest = f" ({', '.join(ours)}; the rest is its CUDA context)" if ours else ""
        lines.append(f"  this process holds {_size(f.this_process)}{rest}")
    elif ours:
        lines.append(f"  this process holds {ours[0]}" + (f" ({ours[1]})" if len(ours) > 1 else ""))
    if f.others:
        more = f" and {len(f.others) - 3} more" if len(f.others) > 3 else ""
        shown = ", ".join(_proc(p) for p in f.others[:3])
        lines.append(f"  other processes hold {_size(_others_bytes(f))}: {shown}{more}")
    elif f.others_known:
        lines.append("  no other process holds memory on it")
    return lines


def _advice(f: OomFacts, spec: RunSpec | None, device: torch.device | None) -> list[str]:
    if spec is None:
        return ["  try a smaller batch or image size"]
    fl, tries = spec.flags, []
    if spec.batch > 1:
        tries.append(f"{fl.batch.format(spec.batch // 2)} (half the batch)")
    elif spec.batch <= 0:
        tries.append(f"a fixed batch such as {fl.batch.format(8)}")
    # autobatch probes CUDA memory only; on a CPU or MPS it keeps the default batch
    if fl.autobatch is not None and device is not None and spec.batch > 1 and not spec.autobatched:
        from libreyolo.engine.autobatch import FRACTION

        tries.append(f"{fl.autobatch} (autobatch: the largest batch that fits in {FRACTION:.0%} of the GPU's memory)")
    smaller = max(32, spec.imgsz * 3 // 4 // 32 * 32)
    if smaller < spec.imgsz:
        tries.append(f"a smaller image size such as {fl.imgsz.format(smaller)}")
    if len(tries) > 1:
        tries[-1] = "or " + tries[-1]
    lines = [f"  try {', '.join(tries)}" if tries else "  try a smaller model"]
    if spec.resumed is not None:  # setup.py's RESUME_OVERRIDABLE: only the device may change, not batch or imgsz
        source = spec.resumed if spec.resumed.lower() != "true" else "its weights/last.pt"
        lines = [
            f"  a resumed run keeps its batch and imgsz: resume on a GPU with more free memory ({fl.device}), or "
            f"start a new run from model={source} with those changed: {', '.join(tries)}"
        ]
    if spec.autobatched:
        lines.append(
            "  autobatch sized the batch from the memory free when it probed; memory another process took since, or a "
            "peak the probe does not see (validation, a CUDA graph capture), can exceed it: set the batch yourself"
        )
    if f.others and _others_bytes(f) >= (f.reserved or 0):  # most of the device is not this run's to give back
        lines.append(f"  or free the GPU: stop the other processes, or pick another GPU with {fl.device}")
    unused = (f.reserved or 0) - (f.allocated or 0)
    if f.needed is not None and f.reserved is not None and f.allocated is not None and unused >= f.needed:
        lines.append(
            f"  {_size(unused)} is reserved but unallocated (fragmented): "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True may let it fit"
        )
    return lines
