"""The run view: every panel of one run, rebuilt from events.jsonl and kept live while it grows."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from textual import getters
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.markup import escape
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Header, Static, TabbedContent, TabPane
from textual.worker import Worker, WorkerState, get_current_worker

from libreyolo_console import supervisor
from libreyolo_console.runs import CRASHED, EVENTS, LIVE, RESUMABLE, classify, last_of, read_head_tail
from libreyolo_console.screens.dialogs import ConfirmScreen
from libreyolo_console.state import RunState
from libreyolo_console.supervisor import STDOUT_LOG, ProcessRecord, ProcessTree, StopResult
from libreyolo_console.tail import EventBatch, EventTail, LineBatch, LineTail, follow
from libreyolo_console.widgets.epochs import EpochTable
from libreyolo_console.widgets.fmt import duration
from libreyolo_console.widgets.gpu_panel import GpuPanel
from libreyolo_console.widgets.graph_log import GraphLog, mode_short
from libreyolo_console.widgets.images import ImagePanel
from libreyolo_console.widgets.log_tail import START_BYTES, LogTail, last_lines
from libreyolo_console.widgets.perclass import PerClassPanel
from libreyolo_console.widgets.plots import LossPlot, MetricsPlot
from libreyolo_console.widgets.processes import ProcessPanel
from libreyolo_console.widgets.progress import ProgressPanel
from libreyolo_console.widgets.run_list import status_text
from libreyolo_console.widgets.verdict import VerdictPanel
from libreyolo_console.widgets.vram import VramPanel

if TYPE_CHECKING:
    from libreyolo_console.app import ConsoleApp

TABS = ("overview", "metrics", "gpu", "profiler", "graphs", "log", "images")
STALL_S = 30.0  # heartbeats come every 10 s: this long without any event means the trainer is stuck
# the panels redrawn from the RunState on every redraw (besides the progress panel, of which there is one)
STATE_PANELS = (LossPlot, MetricsPlot, EpochTable, PerClassPanel, VerdictPanel, GraphLog, VramPanel)
_STATE_PANELS_SELECTOR = ", ".join(panel.__name__ for panel in STATE_PANELS)


class EventsRead(Message):
    def __init__(self, batch: EventBatch) -> None:
        super().__init__()
        self.batch = batch


class LogRead(Message):
    def __init__(self, batch: LineBatch) -> None:
        super().__init__()
        self.batch = batch


class StopProgress(Message):
    def __init__(self, signal_name: str, timeout: float) -> None:
        super().__init__()
        self.signal_name, self.timeout = signal_name, timeout


class RunScreen(Screen[None]):
    BINDINGS = [
        Binding("s", "stop", "Stop"),
        Binding("r", "resume", "Resume"),
        *[Binding(str(i + 1), f"tab('{t}')", "Panels", key_display="1-7", show=i == 0) for i, t in enumerate(TABS)],
        Binding("escape", "runs", "Runs"),
        Binding("n", "new_run", "New run"),
        Binding("w", "wrap", "Wrap"),  # (shown on the log panel, where it acts)
    ]
    # wide terminals show losses and metrics side by side; tall ones add the epoch table to the overview
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (36, "-tall")]

    if TYPE_CHECKING:  # (how Textual types `app` itself: this screen runs in the ConsoleApp)
        app = getters.app(ConsoleApp)

    def __init__(self, run_dir: Path) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.state = RunState()
        self.status = "?"
        self.record: ProcessRecord | None = None
        self.stop_note = ""
        self.stopping = False
        self._dirty = True
        self._tree: ProcessTree | None = None

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="")
        yield Static(id="run-status")
        with TabbedContent(initial="overview"):
            with TabPane("1 Overview", id="overview"):
                yield ProgressPanel()
                yield Static(id="crash-note")
                with Horizontal(id="overview-plots"):
                    yield LossPlot(id="loss-plot")
                    yield MetricsPlot(id="overview-metrics")
                yield EpochTable(id="overview-epochs")
                yield GpuPanel(compact=True, id="overview-gpu")
            with TabPane("2 Metrics", id="metrics"):
                yield MetricsPlot(id="metrics-plot")
                with Horizontal(id="metrics-tables"):
                    yield EpochTable(id="epoch-table")
                    yield PerClassPanel(id="per-class")
            with TabPane("3 GPU", id="gpu"):
                yield GpuPanel(id="gpu-panel")
                yield ProcessPanel()
            with TabPane("4 Profiler", id="profiler"):
                yield VerdictPanel()
            with TabPane("5 Graphs+VRAM", id="graphs"):
                yield GraphLog()
                yield VramPanel()
            with TabPane("6 Log", id="log"):
                yield LogTail()
            with TabPane("7 Images", id="images"):
                yield ImagePanel(self.run_dir)
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.run_dir.name
        self.query_one("#crash-note").display = False
        if not (self.run_dir / STDOUT_LOG).exists():
            self.query_one(LogTail).write_line(
                f"no {STDOUT_LOG} yet: the console writes it for the runs it starts "
                "(a run started with `libreyolo train` prints to its own terminal)"
            )
        self.run_worker(self._follow_events, thread=True, group="tail-events")
        self.run_worker(self._follow_log, thread=True, group="tail-log")
        self.set_interval(0.25, self.redraw)  # (the first process check comes with on_screen_resume, right after mount)
        self.set_interval(1.0, self._poll_process)

    def in_view(self) -> bool:
        """Nothing but dialogs above this screen: a run view opened from another one (or the new-run form's
        run) leaves this one on the stack, where it keeps its state current but neither draws nor polls."""
        stack = self.app.screen_stack
        return self in stack and all(isinstance(s, ModalScreen) for s in stack[stack.index(self) + 1 :])

    def on_screen_resume(self) -> None:
        """Shown: first right after mount, then whenever it is back on top (what arrived meanwhile, at once)."""
        self._dirty = True
        self.check_process()
        self.redraw()

    def _poll_process(self) -> None:
        if self.in_view():
            self.check_process()

    # --- following the files (worker threads) -------------------------------------------------------
    def _follow_events(self) -> None:
        tail = EventTail(self.run_dir / EVENTS)
        follow(tail.read, lambda b: self.post_message(EventsRead(b)), get_current_worker().cancelled_event)

    def _follow_log(self) -> None:
        tail = LineTail(self.run_dir / STDOUT_LOG, from_end=START_BYTES)
        follow(tail.read, lambda b: self.post_message(LogRead(b)), get_current_worker().cancelled_event, interval=0.5)

    def on_events_read(self, message: EventsRead) -> None:
        if message.batch.reset:
            self.state = RunState()  # the file was rewritten: build everything again from its start
        self.state.apply(message.batch.events)
        self.state.bad_lines += message.batch.bad_lines
        self._dirty = True

    def on_log_read(self, message: LogRead) -> None:
        self.query_one(LogTail).add_batch(message.batch)

    # --- drawing ------------------------------------------------------------------------------------
    def redraw(self) -> None:
        """At most 4 redraws a second, however fast events arrive (a re-attach delivers thousands at once)."""
        if not self._dirty or not self.in_view():
            return
        self._dirty = False
        s = self.state
        self.query_one(ProgressPanel).show_state(s)
        for w in self.query(_STATE_PANELS_SELECTOR):  # (in the order they are in the screen)
            if isinstance(w, STATE_PANELS):
                w.show_state(s)
        self.show_status()

    def show_status(self) -> None:
        s, st = self.state, self.start_info()
        line = status_text(self.status)
        if self.status == LIVE and self.record is not None:
            line.append(f" pid {self.record.pid}")
            if s.last_t is not None and time.time() - s.last_t > STALL_S:
                line.append(f"  (no event for {time.time() - s.last_t:.0f} s: stuck?)", style="bold")
        line.append(f"  {st}")
        best = s.best
        if best is not None:
            head = s.task.headline  # detection: mAP50-95; classification: top-1
            line.append(f"  best {s.task.label(head)} {best.metrics[head]:.3f} (epoch {best.epoch + 1})")
        if s.end is not None and self.status != LIVE:
            # the count and the time cover the same span: every process that trained the run
            parts = f" over {s.starts} processes" if s.starts > 1 else ""
            line.append(f"  epochs done {s.end['epochs_done']}/{s.epochs} in {duration(s.train_time_s)}{parts}")
        if self.status in RESUMABLE and supervisor.last_checkpoint(self.run_dir).is_file():
            ck = s.checkpoint
            at = f" (epoch {ck['epoch'] + 1}, step {ck['step']})" if ck else ""
            line.append(f"  r resumes from last.pt{at}")
        if self.stop_note:
            line.append(f"  {self.stop_note}")
        if s.warnings:
            line.append(f"  {len(s.warnings)} warning(s): {s.warnings[-1]['message'][:60]}", style="italic")
        self.query_one("#run-status", Static).update(line)

    def start_info(self) -> str:
        st = self.state.start
        if st is None:
            return ""
        parts = [
            st["model"],
            st["device"] + (f" x{st['world_size']}" if st["world_size"] > 1 else ""),
            f"batch {st['batch']}",
            f"imgsz {st['imgsz']}",
        ]
        if st["amp"]:
            parts.append(f"amp {st['amp_dtype']}")
        graphs = mode_short(self.state)
        if graphs:
            parts.append(graphs)
        return " · ".join(parts)

    # --- the process --------------------------------------------------------------------------------
    def check_process(self) -> None:
        """Once a second: is the run's process alive (pid + start time), and which state is the run in?"""
        self.record = supervisor.read_record(self.run_dir)
        if self.record is None and self.state.start is not None:
            self.record = supervisor.adopt(self.state.start["pid"], self.state.start["t"])
        alive = supervisor.record_alive(self.record)  # adopt() has already checked a run without a record
        start, end = self.state.start, self.state.end
        if not alive and end is None and self.status != CRASHED:
            # the process may have written run_end just before exiting, faster than the tail delivered it
            # (not again once that look found none: a process that is gone writes nothing more)
            _, tail = read_head_tail(self.run_dir / EVENTS)
            start, end = last_of(tail, "run_start") or start, last_of(tail, "run_end")
        status = classify(start, end, self.record, alive)
        if status != self.status:
            self.status = status
            self.refresh_bindings()
            self.show_crash_note()
            self._dirty = True
        self.show_processes(alive)

    def show_crash_note(self) -> None:
        note = self.query_one("#crash-note", Static)
        note.display = self.status == CRASHED
        if self.status == CRASHED:
            lines = last_lines(self.run_dir / STDOUT_LOG, 8)
            who = f"pid {self.record.pid}" if self.record else "the trainer"
            note.update(
                f"[b]crashed[/b]: {who} exited without writing run_end. Last lines of stdout.log:\n"
                + escape("\n".join(lines) or "(empty)")
            )

    def show_processes(self, alive: bool) -> None:
        panel = self.query_one(ProcessPanel)
        if not alive or self.record is None:
            self._tree = None
            panel.show_processes([], "not running" if self.status != "?" else "checking")
            return
        if self._tree is None or self._tree.pid != self.record.pid:
            self._tree = ProcessTree(self.record.pid)
        procs = self._tree.sample()
        panel.show_processes(procs)
        for gpu in self.query(GpuPanel):
            gpu.run_pids = {p.pid for p in procs}

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return self.status == LIVE and not self.stopping
        if action == "resume":
            return self.status in RESUMABLE
        if action == "wrap":
            return self.query_one(TabbedContent).active == "log"
        return True

    # --- actions ------------------------------------------------------------------------------------
    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        self.refresh_bindings()

    def on_tabbed_content_tab_activated(self, _: TabbedContent.TabActivated) -> None:
        self.refresh_bindings()  # w (wrap) shows on the log panel only

    def action_wrap(self) -> None:
        wrapping = self.query_one(LogTail).toggle_wrap()
        self.notify("long log lines wrap" if wrapping else "long log lines scroll sideways", timeout=2)

    def action_runs(self) -> None:
        self.app.show_runs()

    def action_new_run(self) -> None:
        self.app.new_run()

    def action_stop(self) -> None:
        if self.status != LIVE or self.record is None:
            self.notify("this run is not running", severity="warning")
            return
        ladder = self.app.stop_ladder
        later = "; ".join(
            f"{sig.name} if it is still running {wait:.0f} s later"
            for (sig, _), (_, wait) in zip(ladder[1:], ladder[:-1], strict=True)
        )
        detail = (
            f"{ladder[0][0].name} now: the trainer saves weights/last.pt and ends with status "
            f"'interrupted'. Then {later}."
        )
        self.app.push_screen(ConfirmScreen(f"Stop {self.run_dir.name}?", detail), self._confirmed_stop)

    def _confirmed_stop(self, yes: bool | None) -> None:
        if not yes or self.record is None:
            return
        self.stopping = True
        self.refresh_bindings()
        rec = self.record
        # signal the whole group only when the trainer leads its own (always, when the console started it)
        group = rec.pgid == rec.pid

        def work() -> StopResult:
            return supervisor.stop(
                rec,
                self.app.stop_ladder,
                group=group,
                cancel=get_current_worker().cancelled_event,
                on_signal=lambda name, t: self.post_message(StopProgress(name, t)),
            )

        self.run_worker(work, thread=True, group="stop")

    def on_stop_progress(self, message: StopProgress) -> None:
        self.stop_note = f"sent {message.signal_name}, waiting up to {message.timeout:.0f} s"
        self.notify(self.stop_note)
        self._dirty = True

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "stop" or event.state not in (WorkerState.SUCCESS, WorkerState.ERROR):
            return
        self.stopping = False
        result: object = event.worker.result  # a StopResult, or None when the worker failed
        if isinstance(result, StopResult):
            self.stop_note = result.describe()
            self.notify(self.stop_note, severity="error" if result.alive else "information")
            rec = supervisor.read_record(self.run_dir)
            if rec is not None and rec.pid == (self.record.pid if self.record else -1):
                rec.stop = {"ended_by": result.ended_by, "seconds": round(result.seconds, 2), "sent": result.sent}
                supervisor.write_record(self.run_dir, rec)
        else:
            self.notify(f"stopping failed: {event.worker.error}", severity="error")
        self.check_process()
        self.refresh_bindings()

    def action_resume(self) -> None:
        if self.status not in RESUMABLE:
            self.notify(f"a {self.status} run has nothing to resume", severity="warning")
            return
        try:
            self.record = supervisor.resume_run(self.run_dir)
        except (FileNotFoundError, OSError) as e:
            self.notify(str(e), severity="error")
            return
        self.stop_note = ""
        self.notify(f"resuming from {supervisor.last_checkpoint(self.run_dir)} (pid {self.record.pid})")
        self.check_process()
