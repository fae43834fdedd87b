"""GPU: per device utilization, memory, temperature, power and the run's own memory; CPU/RAM without a driver."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import getters
from textual.widget import Widget

from libreyolo_console.gpu import DeviceSample, GpuSnapshot
from libreyolo_console.widgets.fmt import bar, mb

if TYPE_CHECKING:
    from libreyolo_console.app import ConsoleApp


class GpuPanel(Widget):
    """Fed by the app's sampler thread (GpuSnapshot) and by the run view (the run's process ids)."""

    DEFAULT_CSS = "GpuPanel { height: auto; }"

    if TYPE_CHECKING:  # (how Textual types `app` itself: the console's app, whose sampler feeds this panel)
        app = getters.app(ConsoleApp)

    def __init__(self, compact: bool = False, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.compact = compact
        self.snapshot: GpuSnapshot | None = None
        self.run_pids: set[int] = set()

    def on_mount(self) -> None:
        self.app.gpu_signal.subscribe(self, self.show_snapshot)
        if self.app.gpu_snapshot is not None:
            self.show_snapshot(self.app.gpu_snapshot)

    def show_snapshot(self, snap: GpuSnapshot) -> None:
        self.snapshot = snap
        self.refresh(layout=True)

    def render(self) -> Group | Table | Text:
        snap = self.snapshot
        if snap is None:
            return Text("sampling GPU and CPU ...")
        h = snap.host
        host = f"CPU {h.cpu_percent:3.0f}% of {h.cpus} cores   RAM {h.ram_used_gb:.1f} / {h.ram_total_gb:.1f} GB"
        if not snap.devices:
            return Text(f"GPU  {snap.no_driver}\n{host}")
        if self.compact:  # one line per GPU, for the overview
            t = Table.grid(padding=(0, 1))
            for _ in range(6):
                t.add_column(no_wrap=True)
            for d in snap.devices:
                t.add_row(f"GPU{d.index}", _util(d), _mem(d), _temp(d), _power(d), self._run_memory(d.procs))
            return t
        lines = []
        for d in snap.devices:
            mem_frac = d.mem_used_mb / d.mem_total_mb if d.mem_used_mb is not None and d.mem_total_mb else None
            lines.append(Text(f"GPU {d.index}  {d.name}   util {_util(d, 12)}   {_temp(d)}   {_power(d)}"))
            lines.append(Text(f"       memory {_mem(d)} {bar(mem_frac, 12)}   {self._run_memory(d.procs)}"))
        driver = f"   driver {snap.driver}" if snap.driver else ""
        lines.append(Text(host + driver, style="dim"))
        return Group(*lines)

    def _run_memory(self, procs: dict[int, float | None]) -> str:
        """Memory held by this run's processes; NVML lists processes by pid, so the ranks are matched by pid."""
        mine = {pid: used for pid, used in procs.items() if pid in self.run_pids}
        others = len(procs) - len(mine)
        rest = f" (+{others} other proc{'s' if others != 1 else ''})" if others else ""
        if not mine:
            return "run: -" + rest
        known = [u for u in mine.values() if u is not None]
        total = mb(sum(known)) if known else "n/a"  # some drivers (and containers) hide per-process memory
        return f"run: {total} in {len(mine)} proc{'s' if len(mine) != 1 else ''}{rest}"


def _util(d: DeviceSample, width: int = 8) -> str:
    return "-" if d.util is None else f"{bar(d.util / 100, width)} {d.util:3.0f}%"


def _mem(d: DeviceSample) -> str:
    return "-" if d.mem_used_mb is None else f"{mb(d.mem_used_mb)}/{mb(d.mem_total_mb)}"


def _temp(d: DeviceSample) -> str:
    return "-" if d.temp_c is None else f"{d.temp_c:.0f}°C"


def _power(d: DeviceSample) -> str:
    return "-" if d.power_w is None else f"{d.power_w:.0f}/{d.power_limit_w or 0:.0f} W"
