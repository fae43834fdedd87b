"""The run's pictures (results.png, the curves, the confusion matrices, the batch mosaics: docs/quickstart.md) in
the terminal: a list of the image files in the run folder and the chosen one drawn by textual-image, through the
terminal's graphics protocol where it has one (Kitty, Sixel) and in half-block cells where it does not (any
terminal, over SSH too). The folder is looked at every POLL_S seconds: a new picture joins the list, and the one on
show is drawn again when its file changes (the plot writer replaces files whole, never writes them in place)."""

from __future__ import annotations

import io
from pathlib import Path

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

try:  # the console extra's; imported with the app, before it starts: it asks the terminal what it can draw
    from PIL import Image as PILImage
    from textual_image.widget import Image as TerminalImage
except ImportError:  # pragma: no cover  (the console extra installs it)
    TerminalImage = None  # type: ignore[assignment]

POLL_S = 1.0
SUFFIXES = (".png", ".jpg", ".jpeg")
# the order the list shows them in; other pictures follow by name
ORDER = (
    "results.png",
    "confusion_matrix.png",
    "confusion_matrix_normalized.png",
    "PR_curve.png",
    "F1_curve.png",
    "P_curve.png",
    "R_curve.png",
    "topk.png",
    "misclassified.jpg",
    "labels.jpg",
)


def pictures(run_dir: Path) -> dict[str, int]:
    """name -> modification time (ns) of every picture in the run folder (not its temporary files)."""
    out = {}
    try:
        for p in run_dir.iterdir():
            if p.suffix.lower() in SUFFIXES and not p.name.startswith(".") and p.is_file():
                out[p.name] = p.stat().st_mtime_ns
    except OSError:  # the folder is not there (yet), or a file went away while looked at
        pass
    return out


def in_order(names: list[str]) -> list[str]:
    rank = {n: i for i, n in enumerate(ORDER)}
    return sorted(names, key=lambda n: (rank.get(n, len(ORDER)), n))


class ImagePanel(Widget):
    """The list on the left, the picture on the right; up/down (or a click) choose."""

    DEFAULT_CSS = """
    ImagePanel { height: 1fr; }
    ImagePanel #image-list { width: 34; height: 1fr; }
    ImagePanel #image-view { width: 1fr; height: 1fr; }
    ImagePanel #image-title { height: 1; padding: 0 1; }
    ImagePanel #image-shown { width: auto; height: 1fr; }
    """

    def __init__(self, run_dir: Path, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.run_dir = Path(run_dir)
        self.seen: dict[str, int] = {}  # name -> mtime of every picture listed
        self.shown: str | None = None  # the picture on show
        self.shown_mtime: int | None = None  # its file's mtime when it was drawn
        self.loads = 0  # pictures read from disk so far (a redraw after a change is one more)

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield OptionList(id="image-list")
            with Vertical(id="image-view"):
                yield Static(id="image-title")
                if TerminalImage is not None:
                    yield TerminalImage(id="image-shown")
                else:
                    yield Static('textual-image is not installed: pip install "libreyolo[console]"', id="image-shown")

    def on_mount(self) -> None:
        self.poll()
        self.set_interval(POLL_S, self.poll)

    def poll(self) -> None:
        """New pictures join the list; the one on show is drawn again when its file changed."""
        now = pictures(self.run_dir)
        if set(now) != set(self.seen):
            self._relist(now)
        self.seen = now
        if self.shown is None and now:
            self.show(in_order(list(now))[0])
        elif self.shown is not None and now.get(self.shown) not in (None, self.shown_mtime):
            self.show(self.shown)
        if not now:
            self.query_one("#image-title", Static).update("no pictures in this run folder yet")

    def _relist(self, now: dict[str, int]) -> None:
        options = self.query_one("#image-list", OptionList)
        highlighted = self.shown
        options.clear_options()
        names = in_order(list(now))
        options.add_options([Option(n, id=n) for n in names])
        if highlighted in names:
            options.highlighted = names.index(highlighted)

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option.id is not None and event.option.id != self.shown:
            self.show(event.option.id)

    def show(self, name: str) -> None:
        path = self.run_dir / name
        try:
            mtime, data = path.stat().st_mtime_ns, path.read_bytes()
        except OSError:
            return  # gone meanwhile: the next poll drops it
        self.shown, self.shown_mtime = name, mtime
        self.loads += 1
        view = self.query_one("#image-shown")
        if TerminalImage is not None and isinstance(view, TerminalImage):
            img = PILImage.open(io.BytesIO(data))
            img.load()
            view.image = img
            size = f"{img.width}x{img.height}"
        else:
            size = f"{len(data) // 1024} KiB"
        self.query_one("#image-title", Static).update(f"[b]{name}[/b]  {size}")
