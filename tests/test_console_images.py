"""The console's image panel (console/widgets/images.py) under Textual's Pilot: it lists a run folder's pictures in
their order, draws the first, follows the highlighted one, picks up a picture that lands later and draws the one on
show again when its file is replaced; the run view shows it on key 7."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import cv2
import numpy as np
from console_driver import NoGpu, open_run_view, own_settings, until, write_events
from textual.app import App, ComposeResult
from textual.widgets import OptionList, Static

from libreyolo_console.widgets import images as images_mod
from libreyolo_console.widgets.images import ImagePanel


def write_picture(path: Path, seed: int) -> None:
    """Written as the plot writer does: whole, under a temporary name, then moved into place."""
    img = np.random.default_rng(seed).integers(0, 255, (60, 90, 3), dtype=np.uint8)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    cv2.imwrite(str(tmp), img)
    os.replace(tmp, path)


class PanelApp(App[None]):
    def __init__(self, run_dir: Path) -> None:
        super().__init__()
        self.run_dir = run_dir

    def compose(self) -> ComposeResult:
        yield ImagePanel(self.run_dir)


def test_the_panel_lists_draws_and_refreshes(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(images_mod, "POLL_S", 0.1)
    asyncio.run(_lists_draws_and_refreshes(tmp_path))


async def _lists_draws_and_refreshes(tmp_path: Path) -> None:
    write_picture(tmp_path / "train_batch0.jpg", 0)
    write_picture(tmp_path / "results.png", 1)
    (tmp_path / "results.csv").write_text("epoch\n1\n")  # not a picture
    (tmp_path / ".results.tmp.png").write_bytes(b"half a file")  # a write in progress: never listed
    app = PanelApp(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        panel = app.query_one(ImagePanel)
        options = app.query_one(OptionList)
        names = lambda: [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]  # noqa: E731
        await until(pilot, lambda: panel.shown is not None, "the first picture")
        assert names() == ["results.png", "train_batch0.jpg"]
        assert panel.shown == "results.png"
        assert "results.png" in str(app.query_one("#image-title", Static).render())
        # a picture that lands later joins the list in its place, without taking the view
        write_picture(tmp_path / "confusion_matrix.png", 2)
        await until(pilot, lambda: "confusion_matrix.png" in names(), "the new picture in the list")
        assert names() == ["results.png", "confusion_matrix.png", "train_batch0.jpg"]
        assert panel.shown == "results.png"
        # the picture on show is replaced: drawn again
        loads = panel.loads
        time.sleep(0.01)  # a later modification time
        write_picture(tmp_path / "results.png", 3)
        await until(pilot, lambda: panel.loads > loads, "the replaced picture drawn again")
        # choosing another one in the list shows it
        options.focus()
        options.highlighted = 2
        await until(pilot, lambda: panel.shown == "train_batch0.jpg", "the chosen picture")


def test_an_empty_run_folder_says_so(tmp_path: Path) -> None:
    asyncio.run(_empty(tmp_path))


async def _empty(tmp_path: Path) -> None:
    app = PanelApp(tmp_path / "not-yet")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause(0.1)
        assert "no pictures" in str(app.query_one("#image-title", Static).render())
        assert app.query_one(ImagePanel).shown is None


def test_the_run_view_shows_the_pictures_on_key_7(tmp_path: Path, monkeypatch) -> None:
    from conftest import run_start_event

    from libreyolo import events as ev
    from libreyolo_console.app import ConsoleApp

    own_settings(tmp_path, monkeypatch)
    run = tmp_path / "runs" / "exp"
    end = ev.RunEnd(status="finished", epochs_done=1, best_fitness=None, best=None, last=None, time_s=1.0, metrics={})
    write_events(run, [run_start_event(run_dir=str(run), epochs=1), end])
    write_picture(run / "results.png", 0)

    async def go() -> None:
        app = ConsoleApp(project=tmp_path / "runs", attach=run, gpu_sampler=NoGpu())
        async with app.run_test(size=(100, 30)) as pilot:
            await open_run_view(pilot)
            await pilot.press("7")
            await until(pilot, lambda: app.screen.query_one(ImagePanel).shown == "results.png", "the picture")
            assert app.screen.query_one("TabbedContent").active == "images"

    asyncio.run(go())
