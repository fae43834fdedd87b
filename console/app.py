"""libreyolo-console: start, watch, stop and re-attach to training runs from a terminal.

    libreyolo-console                        # the run list (or, with no runs yet, the ready-to-start demo)
    libreyolo-console attach runs/train/exp3 # open one run directly
    libreyolo-console --project runs/other   # list and start runs under another folder

Runs are separate processes in sessions of their own: quitting the console, or losing the SSH
connection, leaves them training; the next console re-attaches from their run folders."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import events
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.signal import Signal
from textual.worker import get_current_worker

from libreyolo_console.gpu import GpuSampler, GpuSnapshot, sample_loop
from libreyolo_console.runs import EVENTS, LIVE, find_run_dirs
from libreyolo_console.screens.loading import FormLoading
from libreyolo_console.screens.run import RunScreen
from libreyolo_console.screens.runs import RunsScreen
from libreyolo_console.settings import load_settings, save_settings
from libreyolo_console.supervisor import LADDER, RECORD, read_record, record_alive
from libreyolo_console.theming import DEFAULT_THEME, load_themes, next_theme
from libreyolo_console.widgets.run_list import RunList

if TYPE_CHECKING:
    from libreyolo_console.screens.new_run import NewRunScreen

DEFAULT_PROJECT = "runs/train"  # TrainConfig's default project: where `libreyolo train` puts runs


def attach_command(run_dir: Path) -> str:
    """The command that re-attaches to a run, with the folder as short as it can be from here."""
    try:
        shown = os.path.relpath(run_dir.resolve())
    except ValueError:  # another drive (Windows)
        shown = str(run_dir.resolve())
    if shown.startswith(".."):
        shown = str(run_dir.resolve())
    return f"libreyolo-console attach {shlex.quote(shown)}"


def farewell(live: list[Path]) -> str:
    """What quitting says when runs are still training (printed after the terminal is restored)."""
    if not live:
        return ""
    lines = [f"libreyolo-console: {len(live)} run(s) keep training in the background. Re-attach with:"]
    lines += [f"  {attach_command(d)}" for d in live]
    return "\n".join(lines)


def load_form() -> tuple[list[str], bool]:
    """The heavy part of the new-run form, run in a thread at start-up: its module (TrainConfig, hence the family
    registry and torch: seconds on a cold start), the model names it suggests, and whether a CUDA device is there
    (the demo then profiles a window of its steps, so every panel has something to show)."""
    import torch

    import libreyolo_console.screens.new_run  # noqa: F401  (imported here for its cost, used once loaded)
    from libreyolo.api import model_names

    return model_names(), torch.cuda.is_available()


class GpuSampled(Message):
    def __init__(self, snapshot: GpuSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class FormLoaded(Message):
    def __init__(self, names: list[str] | None, cuda: bool = False, error: str | None = None) -> None:
        super().__init__()
        self.names, self.cuda, self.error = names, cuda, error


class ConsoleApp(App[None]):
    TITLE = "libreyolo-console"
    CSS_PATH = "console.tcss"
    BINDINGS = [
        Binding("t", "next_theme", "Theme"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        project: str | Path = DEFAULT_PROJECT,
        attach: str | Path | None = None,
        gpu_sampler: GpuSampler | None = None,
        gpu_interval: float = 1.0,
        stop_ladder: tuple[tuple[signal.Signals, float], ...] = LADDER,
        theme: str | None = None,
    ) -> None:
        super().__init__()
        self.project = Path(project)
        self.attach = Path(attach) if attach is not None else None
        self.gpu_sampler = gpu_sampler or GpuSampler()
        self.gpu_interval = gpu_interval
        self.stop_ladder = stop_ladder
        self.gpu_snapshot: GpuSnapshot | None = None
        self.gpu_signal: Signal[GpuSnapshot] = Signal(self, "gpu")
        self.settings = load_settings()
        self._theme_names: list[str] = []
        self._requested_theme = theme
        self.model_names: list[str] | None = None  # set once the new-run form's modules are imported
        self.form_error: str | None = None
        self.demo_suggests: dict[str, str] = {}  # the demo's values beyond the trainer's defaults (GPU: profile)
        self.goodbye = ""  # what main() prints once the terminal is restored (how to re-attach to live runs)

    def on_mount(self) -> None:
        for t in load_themes():
            self.register_theme(t)
            self._theme_names.append(t.name)
        wanted = self._requested_theme or self.settings.get("theme") or DEFAULT_THEME
        self.theme = wanted if wanted in self.available_themes else DEFAULT_THEME
        self.theme_changed_signal.subscribe(self, self._remember_theme)
        self.run_worker(self._sample_gpu, thread=True, group="gpu")
        # torch: off the UI thread, and in a daemon thread of its own (not a worker: asyncio waits for those at
        # exit, so q during the import would hang until it finished)
        threading.Thread(target=self._load_form, name="load-form", daemon=True).start()
        self.push_screen(RunsScreen(self.project))
        if self.attach is not None:
            self.open_run(self.attach)
        elif not find_run_dirs(self.project):
            self.new_run()  # nothing to watch yet: the demo run is one key press away

    # --- GPU sampling, shared by every screen --------------------------------------------------------
    def _sample_gpu(self) -> None:
        sample_loop(
            self.gpu_sampler,
            lambda s: self.post_message(GpuSampled(s)),
            get_current_worker().cancelled_event,
            self.gpu_interval,
        )

    def on_gpu_sampled(self, message: GpuSampled) -> None:
        self.gpu_snapshot = message.snapshot
        self.gpu_signal.publish(message.snapshot)

    # --- quitting: the runs go on, and the user is told how to come back -------------------------------
    def live_runs(self) -> list[Path]:
        """Runs the user has seen live (the run list, the run views on the stack), checked again now."""
        seen: dict[Path, bool] = {}
        for screen in self.screen_stack:
            if isinstance(screen, RunsScreen):
                for r in screen.query_one(RunList).runs.values():
                    if r.status == LIVE:
                        seen.setdefault(r.run_dir.resolve(), True)
            elif isinstance(screen, RunScreen) and screen.status == LIVE:
                seen.setdefault(screen.run_dir.resolve(), True)
        live = []
        for d in seen:
            rec = read_record(d)
            if rec is None or record_alive(rec):  # (a run started by hand has no record: the list's word stands)
                live.append(d)
        return live

    async def action_quit(self) -> None:
        self.goodbye = farewell(self.live_runs())
        self.exit()

    # --- the new-run form's modules, imported in a thread -------------------------------------------------
    def _load_form(self) -> None:
        try:
            self.post_message(FormLoaded(*load_form()))
        except Exception as e:  # shown on the loading screen rather than lost in a thread
            self.post_message(FormLoaded(None, error=f"{type(e).__name__}: {e}"))

    def on_form_loaded(self, message: FormLoaded) -> None:
        self.model_names, self.form_error = message.names, message.error
        self.demo_suggests = {"profile": "true"} if message.cuda else {}
        if isinstance(self.screen, FormLoading):
            self.form_ready(self.screen)
        # (under a dialog, e.g. the command palette, the loading screen calls form_ready when it is back on top)

    def form_ready(self, waiting: FormLoading) -> None:
        """Replace the loading screen by the form (or say why it cannot load) and hand it the keys kept."""
        if self.form_error is not None:
            waiting.error = self.form_error
            waiting.show_note()
            return
        self.switch_screen(self._form())
        for key, char in waiting.queued:  # the keys typed while it loaded, in order, to the form
            self.call_after_refresh(self.post_message, events.Key(key, char))

    def _form(self) -> NewRunScreen:
        from libreyolo_console.screens.new_run import NewRunScreen

        return NewRunScreen(self.project, self.model_names or [], self.demo_suggests)

    # --- navigation -----------------------------------------------------------------------------------
    def open_run(self, run_dir: Path) -> None:
        self.push_screen(RunScreen(run_dir))

    def new_run(self) -> None:
        """The form at once when its modules are loaded; until then a screen that says so and keeps the keys."""
        if self.model_names is None:
            self.push_screen(FormLoading(self.form_error))
        else:
            self.push_screen(self._form())

    def show_started_run(self, run_dir: Path) -> None:
        """The form started a run: replace the form by the run's view."""
        self.switch_screen(RunScreen(run_dir))

    def show_runs(self) -> None:
        while not isinstance(self.screen, RunsScreen) and len(self.screen_stack) > 1:
            self.pop_screen()

    # --- themes -----------------------------------------------------------------------------------------
    def action_next_theme(self) -> None:
        self.theme = next_theme(self.theme, self._theme_names)
        self.notify(f"theme: {self.theme}", timeout=2)

    def _remember_theme(self, theme: object) -> None:
        self.settings["theme"] = self.theme
        save_settings(self.settings)

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("New run", "Open the new-run form", self.new_run)
        yield SystemCommand("Runs", "The list of runs under the project", self.show_runs)
        for name in self._theme_names:
            yield SystemCommand(
                f"Theme: {name}", "Switch to this theme (remembered)", partial(setattr, self, "theme", name)
            )
        if isinstance(screen, RunScreen):
            yield SystemCommand("Stop run", "SIGINT, then SIGTERM, then SIGKILL after timeouts", screen.action_stop)
            yield SystemCommand("Resume run", "Restart a stopped or crashed run from its last.pt", screen.action_resume)


def _run_folder(path: str) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise argparse.ArgumentTypeError(f"{p} is not a folder; pass a run folder such as runs/train/exp3")
    if not ((p / EVENTS).exists() or (p / RECORD).exists()):
        raise argparse.ArgumentTypeError(
            f"{p} is not a run folder (it has no {EVENTS} or {RECORD}); runs live in folders such as runs/train/exp3"
        )
    return p


def main(argv: list[str] | None = None) -> int:
    options = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: the options may come before or after `attach` without one default overwriting the other
    options.add_argument(
        "--project",
        default=argparse.SUPPRESS,
        help=f"folder whose runs are listed and where new runs go (default {DEFAULT_PROJECT})",
    )
    options.add_argument(
        "--theme",
        default=argparse.SUPPRESS,
        help="theme for this session: libreyolo-dark, libreyolo-light, libreyolo-high-contrast (t cycles them)",
    )
    parser = argparse.ArgumentParser(
        prog="libreyolo-console",
        description=__doc__,
        parents=[options],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command")
    attach = sub.add_parser("attach", parents=[options], help="open one run directly (live or finished)")
    attach.add_argument("run_dir", type=_run_folder, help="the run folder, e.g. runs/train/exp3")
    args = parser.parse_args(argv)
    args.project = getattr(args, "project", DEFAULT_PROJECT)
    args.theme = getattr(args, "theme", None)
    app = ConsoleApp(project=args.project, attach=getattr(args, "run_dir", None), theme=args.theme)
    app.run()
    if app.goodbye:
        print(app.goodbye, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
