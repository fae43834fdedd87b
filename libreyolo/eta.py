"""The time left, as the headless renderer and the console both show it: "estimating…" until the step rate is
steady, then a range ("4-6 min") that covers the recent rates.

The trainer's `step.eta_s` is the epoch's current rate times the steps left; early in a run (data set scan, loader
workers starting, warm-up, the first step of every epoch) that rate is far from the run's, and a single number read
from it opened at "5 hours" on a CPU and jumped for minutes. This module reads the per-step seconds back out of each
step event (eta_s / steps left, so a resumed run's offset does not matter) and only answers once they agree."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

ESTIMATING = "estimating…"


def steps_left(epoch: int, step: int, steps: int, epochs: int) -> int:
    """Steps until the run's last one: the rest of this epoch and every later epoch."""
    return max((epochs - epoch) * steps - step, 0)


@dataclass
class EtaEstimator:
    """Feed it every step event (`update`), and `reset()` at each run_start (a resumed process warms up again).

    Steady means: the first `skip` usable samples of the process are left out (start-up), a sample is usable
    from the epoch's `min_step`-th step on (the epoch's first step carries the loader's start), at least `window`
    usable samples followed, and the largest of the last `window` is within `tolerance` of the smallest. Once
    steady it stays so: a later disagreement widens the range rather than falling back to "estimating…"."""

    skip: int = 2
    window: int = 4
    tolerance: float = 0.25
    min_step: int = 2
    _samples: deque[float] = field(default_factory=deque)
    _seen: int = 0
    _steady: bool = False
    _left: int = 0

    def reset(self) -> None:
        self._samples.clear()
        self._seen, self._steady, self._left = 0, False, 0

    def update(self, epoch: int, step: int, steps: int, epochs: int, eta_s: float) -> None:
        self._left = steps_left(epoch, step, steps, epochs)
        if self._left <= 0 or step < min(self.min_step, steps) or not math.isfinite(eta_s) or eta_s <= 0:
            return
        self._seen += 1
        if self._seen <= self.skip:
            return
        self._samples.append(eta_s / self._left)
        while len(self._samples) > self.window:
            self._samples.popleft()
        if len(self._samples) == self.window and max(self._samples) <= min(self._samples) * (1 + self.tolerance):
            self._steady = True

    @property
    def steady(self) -> bool:
        return self._steady

    def estimate(self) -> tuple[float, float] | None:
        """(least, most) seconds left at the recent per-step rates; None while estimating."""
        if not self._steady or not self._samples:
            return None
        return self._left * min(self._samples), self._left * max(self._samples)

    def text(self) -> str:
        est = self.estimate()
        return ESTIMATING if est is None else fmt_range(*est)


def fmt_range(lo: float, hi: float) -> str:
    """Seconds as a rounded range in one unit: '40-50 s', '4-6 min', '1.5-2.0 h'; 'about 5 min' when both ends
    round alike. The low end rounds down and the high end up, so the range holds both."""
    lo, hi = max(min(lo, hi), 0.0), max(lo, hi, 0.0)
    if hi < 90:
        unit, size, fmt = "s", 5.0, "{:.0f}"
    elif hi < 90 * 60:
        unit, size, fmt = "min", 60.0, "{:.0f}"
    else:
        unit, size, fmt = "h", 360.0, "{:.1f}"  # tenths of an hour
    a, b = math.floor(lo / size) * size, math.ceil(hi / size) * size
    scale = {"s": 1.0, "min": 60.0, "h": 3600.0}[unit]
    a_s, b_s = fmt.format(a / scale), fmt.format(max(b, size) / scale)
    return f"about {b_s} {unit}" if a_s == b_s else f"{a_s}-{b_s} {unit}"
