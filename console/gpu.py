"""GPU and host sampling for the console: NVML (nvidia-ml-py) about once a second, in a worker thread.

Sampling happens here, in the console's process, never in the trainer. Without an NVIDIA driver (or
without nvidia-ml-py) the sampler says so once and keeps reporting CPU and RAM through psutil."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import psutil


@dataclass
class DeviceSample:
    index: int
    name: str
    util: float | None  # % of time a kernel ran
    mem_used_mb: float | None
    mem_total_mb: float | None
    temp_c: float | None
    power_w: float | None
    power_limit_w: float | None
    procs: dict[int, float | None] = field(default_factory=dict)  # pid -> MiB (None: the driver will not say)


@dataclass
class HostSample:
    cpu_percent: float
    cpus: int
    ram_used_gb: float
    ram_total_gb: float


@dataclass
class GpuSnapshot:
    devices: list[DeviceSample]
    host: HostSample
    no_driver: str | None = None  # why there are no devices, in words
    driver: str | None = None  # driver version when NVML works


class GpuSampler:
    """`sample()` returns a GpuSnapshot; NVML is initialised lazily on the first call."""

    def __init__(self, nvml: ModuleType | Any | None = None):
        self._nvml = nvml
        self._ready = False
        self.no_driver: str | None = None
        self.driver: str | None = None

    def _init(self) -> None:
        self._ready = True
        if self._nvml is None:
            try:
                import pynvml
            except ImportError:
                self.no_driver = "nvidia-ml-py is not installed (pip install nvidia-ml-py): showing CPU and RAM"
                return
            self._nvml = pynvml
        nv = self._nvml
        try:
            nv.nvmlInit()
            self.driver = _text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError as e:
            self.no_driver = _why(nv, e)

    def sample(self) -> GpuSnapshot:
        if not self._ready:
            self._init()
        host = sample_host()
        nv = self._nvml
        if self.no_driver is not None or nv is None:  # (_init sets one of the two: the module, or why not)
            return GpuSnapshot([], host, self.no_driver)
        try:
            devices = [self._device(nv, i) for i in range(nv.nvmlDeviceGetCount())]
        except nv.NVMLError as e:
            return GpuSnapshot([], host, f"NVML stopped answering ({e}): showing CPU and RAM", self.driver)
        if not devices:
            return GpuSnapshot([], host, "the NVIDIA driver reports no GPU: showing CPU and RAM", self.driver)
        return GpuSnapshot(devices, host, None, self.driver)

    def _device(self, nv: ModuleType | Any, i: int) -> DeviceSample:
        h = nv.nvmlDeviceGetHandleByIndex(i)
        mem = _ask(nv, nv.nvmlDeviceGetMemoryInfo, h)
        util = _ask(nv, nv.nvmlDeviceGetUtilizationRates, h)
        power = _ask(nv, nv.nvmlDeviceGetPowerUsage, h)
        limit = _ask(nv, nv.nvmlDeviceGetEnforcedPowerLimit, h)
        procs = {}
        for p in _ask(nv, nv.nvmlDeviceGetComputeRunningProcesses, h) or []:
            used = getattr(p, "usedGpuMemory", None)
            procs[int(p.pid)] = used / 2**20 if isinstance(used, int) else None
        return DeviceSample(
            index=i,
            name=_text(_ask(nv, nv.nvmlDeviceGetName, h) or f"GPU {i}"),
            util=float(util.gpu) if util is not None else None,
            mem_used_mb=mem.used / 2**20 if mem is not None else None,
            mem_total_mb=mem.total / 2**20 if mem is not None else None,
            temp_c=_ask(nv, nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
            power_w=power / 1000 if power is not None else None,
            power_limit_w=limit / 1000 if limit is not None else None,
            procs=procs,
        )

    def close(self) -> None:
        if self._ready and self.no_driver is None and self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
        self._ready = False


def sample_host() -> HostSample:
    vm = psutil.virtual_memory()
    # interval=None compares with the previous call: at 1 Hz that is a one-second average, without blocking
    return HostSample(psutil.cpu_percent(interval=None), psutil.cpu_count() or 1, vm.used / 1e9, vm.total / 1e9)


def _ask(nv: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """One NVML query; None where the GPU does not support it (temperature or power on some boards)."""
    try:
        return fn(*args)
    except nv.NVMLError:
        return None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _why(nv: Any, e: Exception) -> str:
    if isinstance(e, getattr(nv, "NVMLError_LibraryNotFound", ())):
        return "no NVIDIA driver (libnvidia-ml.so not found): showing CPU and RAM"
    if isinstance(e, getattr(nv, "NVMLError_DriverNotLoaded", ())):
        return "the NVIDIA driver is not loaded: showing CPU and RAM"
    return f"NVML could not start ({e}): showing CPU and RAM"


def sample_loop(
    sampler: GpuSampler, deliver: Callable[[GpuSnapshot], object], stop: threading.Event, interval: float = 1.0
) -> None:
    """Sample every `interval` seconds until `stop` is set; runs in a worker thread."""
    try:
        while not stop.is_set():
            deliver(sampler.sample())
            stop.wait(interval)
    finally:
        sampler.close()
