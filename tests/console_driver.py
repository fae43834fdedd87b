"""Driving the console under Textual's Pilot (App.run_test), shared by the tests/test_console_*.py files: waiting for a
condition, a GPU sampler that sees no GPU, run folders written as the trainer writes them, and opening a run's view."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from libreyolo import events as ev
from libreyolo_console.gpu import GpuSnapshot, HostSample


async def until(pilot: Any, pred: Callable[[], object], what: str, timeout: float = 20.0, every: float = 0.05) -> None:
    """Let the app run until pred() is true; fail the test, naming `what`, after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        await pilot.pause(every)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


class NoGpu:
    """A GPU sampler for a machine without a driver: no devices, a fixed host line (nothing sampled for real)."""

    def sample(self) -> GpuSnapshot:
        return GpuSnapshot([], HostSample(cpu_percent=10.0, cpus=2, ram_used_gb=1.0, ram_total_gb=8.0), "no driver")

    def close(self) -> None:
        pass


def own_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The console's settings file (theme) in the test's folder, never the user's."""
    monkeypatch.setenv("LIBREYOLO_CONSOLE_CONFIG", str(tmp_path / "console.yaml"))


def write_events(run_dir: Path, events: Iterable[ev.Event]) -> Path:
    """A run folder's events.jsonl, written through the trainer's writer and checked against the schema."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "events.jsonl"
    w = ev.EventWriter(path)
    for e in events:
        w.write(e)
    w.close()
    for d in ev.read_events(path):
        ev.validate_event(d)
    return path


async def open_run_view(pilot: Any, timeout: float = 20.0) -> Any:
    """The attached run's view once its events are read (-> the RunScreen)."""
    from libreyolo_console.screens.run import RunScreen

    app = pilot.app
    await until(pilot, lambda: isinstance(app.screen, RunScreen), "the run view", timeout)
    screen = app.screen
    await until(pilot, lambda: screen.state.start is not None, "the run's events", timeout)
    return screen
