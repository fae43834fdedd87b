"""libreyolo train key=value ..."""

from __future__ import annotations

import signal
from typing import Any

from libreyolo.cli.args import parse_kv
from libreyolo.cli.help import show_help


def _terminate(signum: int, frame: Any) -> None:
    # SIGTERM takes the same path as Ctrl-C: save last.pt, write run_end "interrupted", exit
    raise KeyboardInterrupt


def run(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        return show_help("train")
    kwargs = parse_kv(argv)
    from libreyolo import LibreYOLO

    signal.signal(signal.SIGTERM, _terminate)
    # a job started in the background by a non-interactive shell inherits SIGINT ignored: restore Ctrl-C, so
    # `kill -INT` and the console's Stop always take the save-and-exit path
    signal.signal(signal.SIGINT, signal.default_int_handler)
    model = LibreYOLO(kwargs.get("model", "LibreYOLO9t"), pretrained=kwargs.pop("pretrained", True))
    model.train(**kwargs)
    return 0
