"""The new-run form: choose the keys, see the equivalent `libreyolo train` command, start it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from textual import events, getters
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.markup import escape
from textual.screen import Screen
from textual.widgets import Button, Footer, Header, Static

from libreyolo.api import LibreYOLOError
from libreyolo_console import command, supervisor
from libreyolo_console.screens.dialogs import DataPicker
from libreyolo_console.widgets.run_form import RunForm

if TYPE_CHECKING:
    from libreyolo_console.app import ConsoleApp

START_HINT = "enter on Start trains; tab moves between fields; ctrl+s starts from anywhere"


class NewRunScreen(Screen[None]):
    # one key press (enter) trains the demo. Textual's screen focuses AUTO_FOCUS when it becomes active; a
    # focus() in on_mount would come after that default (the first field) had already shown its help
    AUTO_FOCUS = "#start"
    BINDINGS = [
        Binding("ctrl+s", "start", "Start", priority=True),
        Binding("ctrl+o", "pick_data", "Data file", priority=True),
        Binding("ctrl+y", "copy_command", "Copy cmd", priority=True),
        Binding("escape", "back", "Back"),
    ]

    if TYPE_CHECKING:  # (how Textual types `app` itself: this screen runs in the ConsoleApp)
        app = getters.app(ConsoleApp)

    def __init__(self, project: Path, model_names: list[str], demo: dict[str, str] | None = None) -> None:
        super().__init__()
        self.project = project
        self.model_names = model_names
        self.demo = demo or {}
        self.args: list[str] | None = []

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="")
        yield RunForm(self.model_names, demo=self.demo, id="form")
        yield Static(id="form-hint")
        yield Static(id="command")
        yield Static(id="form-error")
        with Horizontal(id="form-buttons"):
            yield Button("Start", id="start", variant="success", compact=True)
            yield Button("Cancel", id="cancel", compact=True)
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "new run"
        self.refresh_command()
        self.query_one("#form-hint", Static).update(START_HINT)

    def on_run_form_changed(self, _: RunForm.Changed) -> None:
        self.refresh_command()

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        """The focused field's full help (the form only has room for its first words)."""
        wid = event.widget.id or ""
        key = wid.removeprefix("field-")
        hint = self.query_one("#form-hint", Static)
        if key in command.FORM_KEYS:
            hint.update(f"[b]{key}[/b]: {escape(command.help_for(key))}")
        elif key == "more":
            hint.update(
                "[b]more[/b]: any other `libreyolo train` key as key=value, checked like the command line checks it"
            )
        else:
            hint.update(START_HINT)

    def refresh_command(self) -> None:
        form = self.query_one(RunForm)
        cmd, err = self.query_one("#command", Static), self.query_one("#form-error", Static)
        try:
            self.args = command.build_args(form.values(), form.more)
        except LibreYOLOError as e:
            self.args = None
            cmd.update("[dim](the command appears once the values are valid)[/dim]")
            err.update(f"[b]![/b] {escape(str(e))}")
            err.add_class("error")
            return
        cmd.update(
            f"[b]$[/b] {escape(command.command_line(self.args))}\n"
            f"[dim]run folder: a new one under {escape(str(self.project))} (exp, exp2, ...)[/dim]"
        )
        err.update("")
        err.remove_class("error")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start":
            self.action_start()
        else:
            self.action_back()

    def action_start(self) -> None:
        self.refresh_command()
        if self.args is None:
            self.app.bell()
            return
        values = self.query_one(RunForm).values()
        problem = command.check_model(values["model"]) or command.check_data(values["data"])
        if problem:
            err = self.query_one("#form-error", Static)
            err.update(f"[b]![/b] {escape(problem)}")
            err.add_class("error")
            self.app.bell()
            return
        try:
            run_dir, _ = supervisor.start_run(self.project, self.args)
        except OSError as e:
            self.notify(f"could not start the trainer: {e}", severity="error")
            return
        self.app.show_started_run(run_dir)

    def action_pick_data(self) -> None:
        def chosen(path: str | None) -> None:
            if path:
                self.query_one(RunForm).set_value("data", path)

        self.app.push_screen(DataPicker(Path.cwd()), chosen)

    def action_copy_command(self) -> None:
        if self.args is not None:
            # OSC 52: most terminals (also over SSH, inside tmux with set-clipboard on) put this on the clipboard
            self.app.copy_to_clipboard(command.command_line(self.args))
            self.notify("command copied to the clipboard (where the terminal allows it)")

    def action_back(self) -> None:
        self.app.pop_screen()
