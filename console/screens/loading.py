"""Stands in for the new-run form while its modules are still importing (TrainConfig pulls in the family
registry and torch: seconds on a cold start). It answers at once, keeps every other key for the form, and
escape goes back to where the user was."""

from __future__ import annotations

from typing import Protocol, cast

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

# keys that act here and now rather than being kept for the form (the app's own bindings among them)
NOT_QUEUED = frozenset({"escape", "q", "t", "ctrl+p", "ctrl+c", "ctrl+q"})
LOADING = "loading the new-run form (importing torch and the model families)…"


class FormHost(Protocol):
    """What this screen needs of the app (ConsoleApp, which imports this module)."""

    model_names: list[str] | None
    form_error: str | None

    def form_ready(self, waiting: FormLoading) -> None: ...


class FormLoading(Screen[None]):
    BINDINGS = [Binding("escape", "back", "Back")]

    def __init__(self, error: str | None = None) -> None:
        super().__init__()
        self.queued: list[tuple[str, str | None]] = []  # (key, character) of every key typed meanwhile
        self.error = error

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="")
        yield Static(id="loading-note")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "new run"
        self.show_note()

    def on_screen_resume(self) -> None:
        """Back on top after a dialog: the modules may have finished loading meanwhile."""
        host = cast(FormHost, self.app)
        if (host.model_names is not None or host.form_error is not None) and self.is_current:
            self.call_later(host.form_ready, self)

    def show_note(self) -> None:
        note = self.query_one("#loading-note", Static)
        if self.error is not None:
            note.update(f"the new-run form could not load: {self.error}\nescape goes back")
            return
        typed = f"  ({len(self.queued)} key(s) kept for the form)" if self.queued else ""
        note.update(f"{LOADING}\nkeys typed now go to the form once it is ready; escape goes back{typed}")

    def on_key(self, event: events.Key) -> None:
        if event.key in NOT_QUEUED or self.error is not None:
            return
        event.stop()
        event.prevent_default()
        self.queued.append((event.key, event.character))
        self.show_note()

    def action_back(self) -> None:
        self.app.pop_screen()
