"""Which other processes hold memory on this run's GPU, from NVML (nvidia-ml-py) where it is installed.

The profiler's report says when the device is full because of memory outside this run's allocator; this names
the processes, with the memory NVML reports for each. Without nvidia-ml-py, a driver that answers, or a way to
match torch's device to NVML's, the answer is None and the report keeps its device-wide figures."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import psutil
import torch


def _pynvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _handle(nv: Any, device: torch.device) -> Any:
    """The NVML handle of torch's `device`, matched by UUID, else by PCI address (CUDA_VISIBLE_DEVICES may renumber
    devices, so torch's index is not NVML's); None when neither matches."""
    props = torch.cuda.get_device_properties(device)
    uuid = str(getattr(props, "uuid", "") or "").lower()
    pci = (
        getattr(props, "pci_domain_id", None),
        getattr(props, "pci_bus_id", None),
        getattr(props, "pci_device_id", None),
    )
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        if uuid and _text(nv.nvmlDeviceGetUUID(h)).lower().removeprefix("gpu-") == uuid.removeprefix("gpu-"):
            return h
        info = nv.nvmlDeviceGetPciInfo(h)
        if None not in pci and (info.domain, info.bus, info.device) == pci:
            return h
    return None


def _name(pid: int) -> str | None:
    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):  # gone, or in another PID namespace (a container sees the host's pids)
        return None


def other_processes(device: torch.device, nvml: Any = None) -> list[dict[str, Any]] | None:
    """[{pid, name, used_mb}] for every process but this one with memory on `device`, largest first; name None when
    this process cannot see it, used_mb None when the driver does not say. None when NVML cannot answer."""
    nv = nvml if nvml is not None else _pynvml()
    if nv is None or device.type != "cuda":
        return None
    try:
        nv.nvmlInit()
    except nv.NVMLError:
        return None
    try:
        h = _handle(nv, device)
        if h is None:
            return None
        procs = {p.pid: p for p in nv.nvmlDeviceGetComputeRunningProcesses(h)}
        procs.update({p.pid: p for p in nv.nvmlDeviceGetGraphicsRunningProcesses(h) if p.pid not in procs})
    except nv.NVMLError:
        return None
    finally:
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass
    me = os.getpid()
    out = [
        {
            "pid": int(pid),
            "name": _name(int(pid)),
            "used_mb": p.usedGpuMemory / 2**20 if isinstance(p.usedGpuMemory, int) else None,
        }
        for pid, p in procs.items()
        if pid != me
    ]
    return sorted(out, key=lambda r: -(r["used_mb"] or 0.0))
