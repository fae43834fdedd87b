"""Small text helpers shared by the panels. Bars use different characters for done and to-do, so they
still read correctly with NO_COLOR or on a 16-colour terminal."""

from __future__ import annotations

from typing import Any

from libreyolo.api import fmt_duration


def duration(seconds: float | None) -> str:
    return "-" if seconds is None else fmt_duration(seconds)


def seconds(v: float | None) -> str:
    """A short span with its unit, precise where it is short: 0.18s, 3.0s, 42s, then m:ss."""
    if v is None:
        return "-"
    if v < 1:
        return f"{v:.2f}s"
    if v < 10:
        return f"{v:.1f}s"
    return f"{v:.0f}s" if v < 60 else fmt_duration(v)


def bar(fraction: float | None, width: int) -> str:
    if width <= 0:
        return ""
    f = 0.0 if fraction is None else min(max(fraction, 0.0), 1.0)
    done = round(f * width)
    return "█" * done + "░" * (width - done)


def num(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def mb(v: float | None) -> str:
    """MiB as a short size: 812 MB, 12.4 GB."""
    if v is None:
        return "-"
    return f"{v / 1024:.1f} GB" if abs(v) >= 1024 else f"{v:.0f} MB"


def off_gpu(start: dict[str, Any] | None) -> str | None:
    """The device of a run that trains without CUDA (cpu, mps), for the panels only a GPU fills; else None."""
    if start is None:
        return None
    device = str(start.get("device", ""))
    return None if device.startswith("cuda") or not device else device
