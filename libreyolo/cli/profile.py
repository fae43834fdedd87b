"""libreyolo profile run|summary|phases|kernels: measure real training steps, then read the report back."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from libreyolo.cli.args import parse_kv
from libreyolo.errors import ConfigError

USAGE = """usage: libreyolo profile {run,summary,phases,kernels} ...

  run DATA --model M [--batch --imgsz --workers --amp/--no-amp --amp-dtype --cuda-graph --steps --warmup --device
                      --repeat N --try --json] [key=value ...]   measure a window of real steps, name the bottleneck
  summary FILE [--json]                                         headline figures and the verdict of a profile.json
  phases FILE [--json]                                          per-phase time (host, GPU, synchronised)
  kernels FILE [--top 10 --phase P --grep RX --sort ms|pct|count|mean|name --json]   the GPU kernels

FILE is a profile.json or the run folder that holds it. docs/profiling.md explains the report."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # a ConfigError prints as one clear line and exits 2, like every command
        raise ConfigError(f"libreyolo profile {self.prog.split()[-1]}: {message}")


def _run_parser() -> argparse.ArgumentParser:
    from libreyolo.config import TrainConfig

    helps = {key: help_ for key, _, help_, _ in TrainConfig.spec()}  # one source for every key's meaning
    p = _Parser(prog="libreyolo profile run", add_help=True)
    p.add_argument("data", help=helps["data"])
    p.add_argument("--model", default="LibreYOLO9t", help=helps["model"])
    p.add_argument("--batch", type=int, help=helps["batch"])
    p.add_argument("--imgsz", type=int, help=helps["imgsz"])
    p.add_argument("--workers", help=helps["workers"])
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None, help=helps["amp"])
    p.add_argument("--amp-dtype", dest="amp_dtype", help=helps["amp_dtype"])
    p.add_argument(
        "--cuda-graph", dest="cuda_graph", nargs="?", const="true", help="true (the network) or full (the whole step)"
    )
    p.add_argument("--steps", type=int, default=20, help="measured steps (two halves)")
    p.add_argument("--warmup", type=int, default=5, help="steps discarded first")
    p.add_argument("--device", help=helps["device"])
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="N trials, each in a fresh process, into prof_1..prof_N; counts of each verdict, step time spread, "
        "profile_repeat.json",
    )
    p.add_argument(
        "--same-process",
        dest="fresh",
        action="store_false",
        help="with --repeat: run the trials one after another in this process (faster to start; later trials share "
        "the CUDA context and cuDNN's autotuning cache)",
    )
    p.add_argument(
        "--try", dest="try_lever", action="store_true", help="apply the verdict's first lever and measure again"
    )
    p.add_argument("--project", default="runs/profile")
    p.add_argument("--name", default="exp")
    p.add_argument(
        "--json", action="store_true", help="print the result as JSON on stdout (training output goes to stderr)"
    )
    p.add_argument("keys", nargs="*", help="any other training key=value (e.g. mosaic=0 cache=ram)")
    return p


def _file_parser(cmd: str) -> argparse.ArgumentParser:
    p = _Parser(prog=f"libreyolo profile {cmd}")
    p.add_argument("file", help="profile.json, or the run folder holding it")
    p.add_argument("--json", action="store_true")
    if cmd == "kernels":
        from libreyolo.profiler.report import KERNEL_SORTS

        p.add_argument("--top", type=int, default=10, help="rows to show (0: all)")
        p.add_argument("--phase", help="only kernels launched in this phase (forward, backward, ...)")
        p.add_argument("--grep", help="only kernels whose name matches this regular expression")
        p.add_argument("--sort", default="ms", choices=sorted(KERNEL_SORTS))
    return p


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=1, default=float) + "\n")


def cmd_run(argv: list[str]) -> int:
    from libreyolo.cli.profile_run import run_profile, verdict_counts

    a = _run_parser().parse_intermixed_args(argv)  # key=value pairs may come before or after the flags
    if a.repeat < 1 or a.steps < 1 or a.warmup < 0:
        raise ConfigError(
            f"--repeat {a.repeat} --steps {a.steps} --warmup {a.warmup}: repeat and steps must be >= 1, warmup >= 0"
        )
    overrides = parse_kv(a.keys)
    flags = {
        "model": a.model,
        "data": a.data,
        "batch": a.batch,
        "imgsz": a.imgsz,
        "workers": a.workers,
        "amp": a.amp,
        "amp_dtype": a.amp_dtype,
        "cuda_graph": a.cuda_graph,
        "device": a.device,
        "profile_steps": a.steps,
        "profile_warmup": a.warmup,
    }
    overrides.update({k: v for k, v in flags.items() if v is not None})
    from libreyolo import oom

    with (
        contextlib.redirect_stdout(sys.stderr) if a.json else contextlib.nullcontext(),
        oom.explained(lambda: oom.config_spec("profiling", overrides, oom.PROFILE)),
    ):
        result = run_profile(overrides, a.project, a.name, a.repeat, a.try_lever, a.fresh)
    if a.json:
        _print_json(result)
        return 0
    from libreyolo.profiler.report import console as report_console

    console = report_console()
    if a.repeat > 1:
        t = Table(
            title=f"{a.repeat} trials ({result['repeat']})",
            title_justify="left",
            box=None,
            padding=(0, 2),
            header_style="bold",
        )
        for col in ("trial", "verdict", "step ms", "img/s"):
            t.add_column(col, justify="left" if col in ("trial", "verdict") else "right")
        for tr in result["trials"]:
            t.add_row(tr["run_dir"], tr["verdict"], f"{tr['step_ms']:.1f}", f"{tr['img_s']:.1f}")
        t.add_row(
            "mean ± std",
            result["verdict"],
            f"{result['step_ms']['mean']:.1f} ± {result['step_ms']['std']:.1f}",
            f"{result['img_s']['mean']:.1f} ± {result['img_s']['std']:.1f}",
        )
        console.print(t)
        sm = result["step_ms"]
        how = "a fresh process each" if result["process"] == "fresh per trial" else "one process"
        console.print(f"verdicts over {a.repeat} trials ({how}): {verdict_counts(result)}")
        console.print(f"step time min / median / max: {sm['min']:.1f} / {sm['median']:.1f} / {sm['max']:.1f} ms")
    if result["try"] is not None:
        _print_try(console, result["try"])
    return 0


def _print_try(console: Console, tr: dict[str, Any]) -> None:
    if tr["after"] is None:
        console.print(f"--try: {tr['note']}")
        return
    lever = " ".join(f"{k}={v}" for k, v in tr["lever"].items())
    t = Table(
        title=f"--try {lever} ({tr['lever_text']})", title_justify="left", box=None, padding=(0, 2), header_style="bold"
    )
    for col in ("", "before", "after", "after / before"):
        t.add_column(col, justify="left" if not col else "right")
    b, a = tr["before"], tr["after"]
    t.add_row("verdict", b["verdict"], a["verdict"], "")
    t.add_row(
        "step ms",
        f"{b['step_ms']['mean']:.2f}",
        f"{a['step_ms']['mean']:.2f}",
        f"{a['step_ms']['mean'] / b['step_ms']['mean']:.2f}x",
    )
    t.add_row("img/s", f"{b['img_s']['mean']:.1f}", f"{a['img_s']['mean']:.1f}", f"{tr['speedup']:.2f}x")
    console.print(t)
    if tr.get("note"):
        console.print(f"  {tr['note']}")
    console.print(f"  written to {tr['path']}")


def cmd_file(cmd: str, argv: list[str]) -> int:
    from libreyolo.profiler import report
    from libreyolo.profiler.schema import load_profile

    a = _file_parser(cmd).parse_args(argv)
    p = load_profile(a.file)
    console = report.console()
    if cmd == "summary":
        if a.json:
            _print_json({k: p[k] for k in ("meta", "window", "headline", "verdict")})
            return 0
        console.print(report.headline_table(p))
        for line in report.verdict_lines(p):
            console.print(line)
    elif cmd == "phases":
        if a.json:
            _print_json(p["phases"])
            return 0
        console.print(report.phases_table(p))
    else:
        if a.phase is not None and a.phase not in {r["name"] for r in p["phases"]} | {"other", "copy"}:
            raise ConfigError(
                f"--phase {a.phase!r}: not a phase of this profile; use one of "
                f"{', '.join(r['name'] for r in p['phases'])}, other, copy"
            )
        rows = report.select_kernels(p, a.top, a.phase, a.grep, a.sort)
        if a.json:
            _print_json(rows)
            return 0
        if not p["kernels"]:
            console.print(f"no GPU kernels in {a.file} (a {p['meta']['device']} run); the CPU ops instead:")
            console.print(report.cpu_ops_table(p, a.top or 50))
            return 0
        console.print(report.kernels_table(rows))
    return 0


def run(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "run":
        return cmd_run(rest)
    if cmd in ("summary", "phases", "kernels"):
        return cmd_file(cmd, rest)
    raise ConfigError(
        f"unknown profile command {cmd!r}; use run, summary, phases or kernels (libreyolo profile --help)"
    )
