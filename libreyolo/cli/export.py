"""libreyolo export model=best.pt format=onnx|torchscript [imgsz= batch= dynamic= half= nms= opset= dynamo= ...]:
the trained network as a graph beside its weights, checked against PyTorch (docs/export.md)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from libreyolo.cli.args import parse_kv
from libreyolo.export.options import KEYS


def run(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        console = Console(highlight=False)
        console.print("usage: libreyolo export model=WEIGHTS [key=value ...]\n", markup=False)
        table = Table(box=None, padding=(0, 2), header_style="bold")
        for c in ("key", "default", "meaning"):
            table.add_column(c)
        table.add_row("model", "'LibreYOLO9t'", "weights (.pt) or a model name (random init)")
        for k in KEYS:
            table.add_row(k.name, repr(k.default) if isinstance(k.default, str) else str(k.default), escape(k.help))
        console.print(table)
        return 0
    kw = parse_kv(argv, set(), {"model": str, **{k.name: k.parse for k in KEYS}}, command="export")
    from libreyolo import LibreYOLO

    model = LibreYOLO(kw.pop("model", "LibreYOLO9t"))
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    model.export(log=lambda line: err.print(escape(line)), **kw)
    return 0
