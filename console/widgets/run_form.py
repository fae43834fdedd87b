"""The new-run form: the keys of console.command.FORM_KEYS, each with the CLI's help text beside it."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.suggester import SuggestFromList
from textual.widgets import Input, Label, Select

from libreyolo_console import command


class RunForm(VerticalScroll):
    """Holds the values as text; untouched fields follow the defaults of the chosen dataset."""

    can_focus = False  # tab goes straight from field to field

    class Changed(Message):
        """A value changed (by the user or because the dataset's defaults did)."""

    def __init__(self, model_names: list[str], demo: dict[str, str] | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.model_names = model_names
        self.demo = demo or {}  # values the demo (the built-in dataset) suggests beyond the trainer's defaults
        self.touched: set[str] = set()
        # what the form itself put in each field: a Changed event carrying that value is not the user's edit
        # (Input and Select also announce their initial values)
        self.placed: dict[str, str] = self.suggested()

    def suggested(self, data: str = "shapes") -> dict[str, str]:
        """What an untouched field shows for this dataset: the trainer's default, and for the demo its
        suggestions (spelled out in the command, since the trainer would not use them by itself)."""
        return {**command.defaults(data), **(self.demo if command.is_builtin_data(data) else {})}

    def compose(self) -> ComposeResult:
        base = self.suggested()
        for key in command.FORM_KEYS:
            with Horizontal(classes="form-row"):
                yield Label(key, classes="form-key")
                yield self._control(key, base[key])
                yield Label(command.help_for(key), classes="form-help")
        with Horizontal(classes="form-row"):
            yield Label("more", classes="form-key")
            yield Input(
                placeholder="other key=value pairs, e.g. lr0=0.02 cos_lr=true (libreyolo train --help)",
                id="field-more",
                compact=True,
            )

    def _control(self, key: str, value: str) -> Input | Select[str]:
        wid = f"field-{key}"
        if key in command.CHOICES:
            return Select([(c, c) for c in command.CHOICES[key]], value=value, allow_blank=False, id=wid, compact=True)
        suggester = SuggestFromList(self.model_names, case_sensitive=False) if key == "model" else None
        return Input(value=value, id=wid, compact=True, suggester=suggester)

    def _field(self, key: str) -> Input | Select[str]:
        """The control _control made for a key of FORM_KEYS."""
        field = self.query_one(f"#field-{key}")
        if not isinstance(field, (Input, Select)):
            raise TypeError(f"#field-{key} is a {type(field).__name__}, not an Input or a Select")
        return field

    def values(self) -> dict[str, str]:
        return {key: str(self._field(key).value) for key in command.FORM_KEYS}

    @property
    def more(self) -> str:
        return self.query_one("#field-more", Input).value

    def set_value(self, key: str, value: str) -> None:
        """Set a field as the user would (it counts as touched)."""
        self._put(key, value)
        self.touched.add(key)
        if key == "data":
            self.follow_defaults()
        self.post_message(self.Changed())

    def _put(self, key: str, value: str) -> None:
        self.placed[key] = value
        with self.prevent(Input.Changed, Select.Changed):
            self._field(key).value = value

    def follow_defaults(self) -> None:
        """Give every field the user has not edited the default for the current dataset."""
        base = self.suggested(self.values()["data"])
        for key in command.FORM_KEYS:
            if key not in self.touched and key != "data" and self.values()[key] != base[key]:
                self._put(key, base[key])

    def _changed(self, widget_id: str | None, value: object) -> None:
        if widget_id and widget_id.startswith("field-") and widget_id != "field-more":
            key = widget_id.removeprefix("field-")
            if str(value) != self.placed.get(key):
                self.touched.add(key)
            if key == "data":
                self.follow_defaults()
        self.post_message(self.Changed())

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._changed(event.input.id, event.value)

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        self._changed(event.select.id, event.value)
