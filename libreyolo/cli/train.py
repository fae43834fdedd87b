"""libreyolo train key=value ..."""

from __future__ import annotations

import signal

from libreyolo.cli.args import parse_kv
from libreyolo.cli.help import show_help


def run(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        return show_help("train")
    kwargs = parse_kv(argv)
    from libreyolo import LibreYOLO
    from libreyolo.engine.interrupt import raise_interrupt

    signal.signal(signal.SIGTERM, raise_interrupt)  # SIGTERM takes Ctrl-C's path (engine/interrupt.py)
    # a job started in the background by a non-interactive shell inherits SIGINT ignored: restore Ctrl-C, so
    # `kill -INT` and the console's Stop always take the save-and-exit path
    signal.signal(signal.SIGINT, signal.default_int_handler)
    model = LibreYOLO(kwargs.get("model", "LibreYOLO9t"), pretrained=kwargs.pop("pretrained", True))
    model.train(**kwargs)
    return 0
