"""GPU: per device utilization, memory, temperature, power and the run's own memory; CPU/RAM without a driver."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widget import Widget

from console.gpu import GpuSnapshot
from console.widgets.fmt import bar, mb


class GpuPanel(Widget):
    """Fed by the app's sampler thread (GpuSnapshot) and by the run view (the run's process ids)."""

    DEFAULT_CSS = "GpuPanel { height: auto; }"

    def __init__(self, compact: bool = False, **kw: object) -> None:
        super().__init__(**kw)
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

    def render(self) -> Table | Text:
        snap = self.snapshot
        if snap is None:
            return Text("sampling GPU and CPU ...")
        h = snap.host
        host = f"CPU {h.cpu_percent:3.0f}% of {h.cpus} cores   RAM {h.ram_used_gb:.1f} / {h.ram_total_gb:.1f} GB"
        if not snap.devices:
            return Text(f"GPU  {snap.no_driver}\n{host}")
        t = Table.grid(padding=(0, 1))
        for col in ("gpu", "util", "memory", "temp", "power", "run"):
            t.add_column(col, no_wrap=True)
        for d in snap.devices:
            util = "-" if d.util is None else f"{bar(d.util / 100, 8)} {d.util:3.0f}%"
            mem = "-" if d.mem_used_mb is None else f"{mb(d.mem_used_mb)}/{mb(d.mem_total_mb)}"
            temp = "-" if d.temp_c is None else f"{d.temp_c:.0f}°C"
            power = "-" if d.power_w is None else f"{d.power_w:.0f}/{d.power_limit_w or 0:.0f} W"
            t.add_row(f"{d.index} {d.name}" if not self.compact else f"GPU{d.index}", util, mem, temp, power, self._run_memory(d.procs))
        if not self.compact:
            t.add_row(Text(host, style="dim"), "", "", "", "", "")
        return t

    def _run_memory(self, procs: dict[int, float | None]) -> str:
        """Memory held by this run's processes; NVML lists processes by pid, so the ranks are matched by pid."""
        mine = {pid: used for pid, used in procs.items() if pid in self.run_pids}
        if not mine:
            return f"run: -  ({len(procs)} other process{'es' if len(procs) != 1 else ''})" if procs else "run: -"
        known = [u for u in mine.values() if u is not None]
        total = mb(sum(known)) if known else "n/a"
        return f"run: {total} in {len(mine)} process{'es' if len(mine) != 1 else ''}"
