"""Progress: epoch and step, a bar over the whole schedule, ETA, images/s and the data-wait share."""

from __future__ import annotations

from textual.widget import Widget

from libreyolo_console.state import RunState
from libreyolo_console.widgets.fmt import bar


class ProgressPanel(Widget):
    DEFAULT_CSS = "ProgressPanel { height: 2; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.state = RunState()

    def show_state(self, state: RunState) -> None:
        self.state = state
        self.refresh()

    def render(self) -> str:
        s = self.state
        if s.start is None:
            return "waiting for the trainer's first event (it imports torch and checks the dataset first)"
        # the run list's convention: epochs completed (the step is the current epoch's)
        ep = f"epochs done {s.epochs_done}/{s.epochs}  step {s.step}/{s.steps}"
        pct = f"{s.fraction * 100:3.0f}%"
        last = s.last_step
        eta = "" if s.end is not None or last is None else f"  ETA {s.eta.text()}"
        width = max(self.size.width - len(ep) - len(pct) - len(eta) - 4, 8)
        line1 = f"{ep}  {bar(s.fraction, width)} {pct}{eta}"
        if last is None:
            return line1 + "\nno step yet"
        parts = [
            f"{last['img_s']:.1f} img/s",
            f"data wait {last['data_frac'] * 100:.0f}%",
            f"{last['step_ms']:.1f} ms/step",
            f"lr {last['lr']:.3g}",
        ]
        if last.get("gpu_mem_gb"):
            parts.append(f"mem {last['gpu_mem_gb']:.1f} GB")
        if s.mosaic is not None:
            parts.append("mosaic" if s.mosaic else "no mosaic")
        return line1 + "\n" + "  ".join(parts)
