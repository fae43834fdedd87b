"""The GPU panel on a real NVIDIA GPU (device machine only: `python -m pytest -m gpu tests/test_console_gpu.py -s`).

A real training run on GPU 0 must show non-zero utilization and the trainer's own memory, found by its pid
in NVML's process list. The test prints a text capture of the panel (for docs/console.md) and leaves it in
$LIBREYOLO_CONSOLE_CAPTURE if that is set."""

import asyncio
import io
import os
import re
import signal
import time

import pytest
from rich.console import Console

from libreyolo_console.app import ConsoleApp
from libreyolo_console.gpu import GpuSampler
from libreyolo_console.screens.run import RunScreen
from libreyolo_console.supervisor import ProcessTree, read_record, record_alive, start_run
from libreyolo_console.widgets.gpu_panel import GpuPanel

pytestmark = pytest.mark.gpu


def test_gpu_panel_shows_utilization_and_the_trainer_memory(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    monkeypatch.setenv("LIBREYOLO_CONSOLE_CONFIG", str(tmp_path / "console.yaml"))
    # the built-in dataset at 320 px keeps the GPU busy for long enough to be sampled
    run_dir, rec = start_run(
        tmp_path / "runs", ["epochs=3", "imgsz=320", "batch=64", "device=0", "workers=4", "log_interval=0.2"]
    )
    try:
        sampler = GpuSampler()
        busy = mine = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (busy and mine):
            assert record_alive(rec), (run_dir / "stdout.log").read_text()[-3000:]
            snap = sampler.sample()
            assert snap.no_driver is None, snap.no_driver
            pids = {p.pid for p in ProcessTree(rec.pid).sample()}
            busy = busy or any((d.util or 0) > 0 for d in snap.devices)
            mine = mine or next(
                (used for d in snap.devices for pid, used in d.procs.items() if pid in pids and used), None
            )
            time.sleep(1.0)
        sampler.close()
        assert busy, "NVML never reported a busy GPU while training"
        assert mine, f"NVML never listed the trainer (pids {sorted(pids)}) with its memory: {snap.devices}"

        async def capture() -> str:
            app = ConsoleApp(project=tmp_path / "runs", attach=run_dir)
            async with app.run_test(size=(100, 30)) as pilot:
                for _ in range(100):
                    s = app.screen
                    if (
                        isinstance(s, RunScreen)
                        and s.state.last_step
                        and app.gpu_snapshot
                        and s.query_one("#gpu-panel", GpuPanel).run_pids
                    ):
                        break
                    await pilot.pause(0.2)
                await pilot.press("3")
                await pilot.pause(1.5)
                panel = app.screen.query_one("#gpu-panel", GpuPanel)
                out = Console(width=100, record=True, color_system=None, file=io.StringIO())
                out.print(panel.render())
                return out.export_text()

        text = asyncio.run(capture())
        print("\n" + text)
        if os.environ.get("LIBREYOLO_CONSOLE_CAPTURE"):
            with open(os.environ["LIBREYOLO_CONSOLE_CAPTURE"], "w") as f:
                f.write(text)
        # the device the run trains on shows the run's own memory, found by the trainer's pid
        assert re.search(r"util .*\d+%", text) and re.search(r"run: [\d.]+ [MG]B in \d+ procs?", text), text
    finally:
        rec = read_record(run_dir)
        if rec is not None and record_alive(rec):
            os.killpg(rec.pgid, signal.SIGKILL)
