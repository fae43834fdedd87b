"""`libreyolo` command: train, val, predict, profile, bench, data."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape

from libreyolo.errors import LibreYOLOError

COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("libreyolo.cli.train", "train a model (no arguments: LibreYOLO9t on the built-in dataset)"),
    "val": ("libreyolo.cli.val", "validate a checkpoint on a dataset: mAP50, mAP50-95, precision, recall"),
    "predict": ("libreyolo.cli.predict", "detect objects in images"),
    "profile": ("libreyolo.cli.profile", "profile real training steps: run | summary | phases | kernels"),
    "bench": ("libreyolo.cli.bench", "benchmarks: step (training step ms, eager vs CUDA graphs) | loader (images/s)"),
    "export": ("libreyolo.cli.export", "write a trained model as ONNX or TorchScript, checked against PyTorch"),
    "data": ("libreyolo.cli.data", "datasets: prepare (verify, label cache, disk cache) | shapes | dense (generate)"),
}

USAGE = "usage: libreyolo COMMAND [key=value ...]   (libreyolo COMMAND --help for its keys)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # soft_wrap: an error names a file path; hard-wrapping it at 80 columns would break it for copy and grep
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    if not argv or argv[0] in ("-h", "--help", "help"):
        console.print(USAGE + "\n\ncommands:", markup=False)
        for name, (_, help_) in COMMANDS.items():
            console.print(f"  {name:<9} {help_}")
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from libreyolo import __version__

        print(__version__)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        import difflib

        near = difflib.get_close_matches(cmd, list(COMMANDS), n=1)
        console.print(
            f"[red]error:[/] unknown command {cmd!r}"
            + (f"; did you mean {near[0]!r}?" if near else "")
            + f"\n{escape(USAGE)}"
        )
        return 2
    import contextlib
    import importlib

    from libreyolo.cli import cudastart
    from libreyolo.engine.heap import held_collections

    cudastart.start(argv)  # the CUDA driver starts while the command's module imports torch
    # a run's start without the garbage collector's full walks of the heap that its imports set off (engine/heap.py)
    try:
        with held_collections() if cmd == "train" else contextlib.nullcontext():
            run: Callable[[list[str]], int] = importlib.import_module(COMMANDS[cmd][0]).run
            return run(rest)
    except LibreYOLOError as e:
        console.print(f"[red]error:[/] {escape(str(e))}")
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        return 130


def entry() -> None:
    """The `libreyolo` command. Once a command has finished (its files written and closed, its workers
    stopped), the process ends without the interpreter's teardown: unloading torch and CUDA and running every
    module's finalisers costs seconds after a run whose results are already on disk."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
