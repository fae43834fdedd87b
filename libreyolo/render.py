"""Headless rendering of the event stream with rich: a live bar per epoch on a terminal, plain lines in CI."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table

from libreyolo import events as ev
from libreyolo.eta import EtaEstimator
from libreyolo.tasks import DETECT, TASKS


def _interactive() -> bool:
    return sys.stdout.isatty() and not os.environ.get("CI") and os.environ.get("TERM") != "dumb"


def fmt_duration(s: float) -> str:
    """Seconds as m:ss, or h:mm:ss from an hour on (progress lines, run summaries, the console)."""
    s = int(max(s, 0))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def per_class_table(rows: list[dict[str, Any]], overall: dict[str, Any], title: str = "per class") -> Table:
    """The per-class table (`libreyolo val`, and a run's end): the row of all classes (overall: images, precision,
    recall, map50, map), then a row per class in the dataset's names order (a class without ground truth shows -)."""
    t = Table(title=title)
    for c in ("class", "images", "instances", "P", "R", "mAP50", "mAP50-95"):
        t.add_column(c, justify="left" if c == "class" else "right")
    instances = sum(r["instances"] for r in rows)
    t.add_row(
        "all",
        str(overall["images"]),
        str(instances),
        *(f"{overall[k]:.4f}" for k in ("precision", "recall", "map50", "map")),
    )
    for r in rows:
        vals = ("-" if r[k] is None else f"{r[k]:.4f}" for k in ("precision", "recall", "map50", "map"))
        t.add_row(escape(str(r["class"])), str(r["images"]), str(r["instances"]), *vals)
    return t


class RichRenderer:
    """A callback: feed it events. `plain=None` picks live bars on a TTY and plain lines otherwise."""

    def __init__(self, plain: bool | None = None, console: Console | None = None, plain_every_s: float = 5.0):
        self.plain = (not _interactive()) if plain is None else plain
        self.console = console or Console(highlight=False, soft_wrap=True)
        self.plain_every_s = plain_every_s
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._eta = EtaEstimator()  # "estimating…" until the step rate is steady, then a range
        self._last_plain = 0.0
        self._epochs = 0
        self._terms: list[str] = []  # the family's loss terms, from run_start
        self._labels: dict[str, str] = dict(zip(DETECT.metric_names, DETECT.labels))  # metric -> column heading
        self._detect = True
        self._task = DETECT
        self._best: tuple[float, ev.Val] | None = None  # the best validation with per-class rows (fitness, event)

    def __call__(self, e: ev.Event) -> None:
        handler = getattr(self, "_on_" + e.type, None)
        if handler:
            handler(e)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    # --- handlers -----------------------------------------------------------------------------------
    def _on_run_start(self, e: ev.RunStart) -> None:
        self._epochs, self._terms = e.epochs, list(e.loss_terms)
        task = TASKS.get(e.task)
        self._detect = task.mosaic if task is not None else True  # a task with mosaic epochs tells them apart
        self._labels = {m: task.label(m) if task else m for m in e.metrics}
        self._task, self._best = task or DETECT, None
        self._eta.reset()  # a resumed process warms up again
        c = self.console
        c.print(
            f"[bold]libreyolo[/] {e.model} ({e.params / 1e6:.2f}M params, {e.nc} classes) on {e.device}"
            + (f" x{e.world_size}" if e.world_size > 1 else "")
        )
        c.print(f"  data {e.data}: {e.train_images} train / {e.val_images} val images, imgsz {e.imgsz}")
        c.print(
            f"  batch {e.batch} (per rank {e.batch_per_rank}, accumulate {e.accumulate}), workers {e.workers}, "
            f"{e.optimizer}, amp {e.amp_dtype if e.amp else 'off'}, cuda_graph {e.cuda_graph_mode}"
        )
        c.print(f"  {e.cuda_graph_reason}")
        c.print(f"  run dir {e.run_dir}" + ("  [yellow](resumed)[/]" if e.resumed else ""))

    def _on_epoch_start(self, e: ev.EpochStart) -> None:
        desc = f"Epoch {e.epoch + 1}/{e.epochs}" + ("" if e.mosaic or not self._detect else " (no mosaic)")
        if self.plain:
            self.console.print(desc + f": {e.steps} steps")
            return
        self.close()
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TextColumn("eta {task.fields[eta]}"),
            console=self.console,
            transient=False,
        )
        self._task = self._progress.add_task(desc, total=e.steps, stats="", eta=self._eta.text())
        self._progress.start()

    def _on_step(self, e: ev.Step) -> None:
        self._eta.update(e.epoch, e.step, e.steps, self._epochs, e.eta_s)
        lo = e.losses  # empty until the epoch's first asynchronous read-back has landed
        losses = " ".join(f"{k} {lo[k]:.3f}" if k in lo else f"{k} -" for k in self._terms or lo)
        stats = f"{losses} | {e.img_s:.0f} img/s data {e.data_frac:.0%}" + (
            f" | {e.gpu_mem_gb:.1f}G" if e.gpu_mem_gb else ""
        )
        if self.plain:
            now = time.time()
            if now - self._last_plain >= self.plain_every_s or e.step == e.steps:
                self._last_plain = now
                self.console.print(
                    f"  [{e.epoch + 1}/{self._epochs}] {e.step}/{e.steps} {stats} eta {self._eta.text()}"
                )
        elif self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=e.step, stats=stats, eta=self._eta.text())

    def _on_val(self, e: ev.Val) -> None:
        self.close()
        if e.per_class and self._task.fitness_weights.keys() <= e.metrics.keys():
            fitness = self._task.fitness(e.metrics)
            if self._best is None or fitness > self._best[0]:
                self._best = (fitness, e)
        t = Table(box=None, padding=(0, 2), show_edge=False)
        terms = self._terms or list(e.losses)
        metrics = [m for m in self._labels if m in e.metrics] or list(e.metrics)
        for col in ("images", *(self._labels.get(m, m) for m in metrics), "val " + "/".join(terms), "time"):
            t.add_column(col, justify="right")
        t.add_row(
            str(e.images),
            *(f"{e.metrics[m]:.3f}" for m in metrics),
            "/".join(f"{e.losses.get(k, 0):.3f}" for k in terms),
            f"{e.time_s:.1f}s",
        )
        self.console.print(t)

    def _on_epoch_end(self, e: ev.EpochEnd) -> None:
        self.close()
        if self.plain:
            lo = e.losses
            losses = " ".join(f"{k} {lo.get(k, 0):.3f}" for k in self._terms or lo)
            self.console.print(f"  epoch {e.epoch + 1} done in {e.time_s:.1f}s ({e.img_s:.0f} img/s): {losses}")

    def _on_checkpoint(self, e: ev.Checkpoint) -> None:
        if e.kind in ("best", "interrupt"):
            self.console.print(f"  [dim]saved {e.kind} -> {escape(e.path)}[/]")

    def _on_amp(self, e: ev.Amp) -> None:
        if e.epoch is None or e.skipped_steps:
            self.console.print(f"  amp: {escape(e.reason)}")

    def _on_graph(self, e: ev.Graph) -> None:
        extra = f" (+{e.delta_allocated_mb:.0f} MB allocated)" if e.delta_allocated_mb is not None else ""
        self.console.print(f"  cuda_graph {e.action}: {escape(e.reason)}{extra}")

    def _on_profile(self, e: ev.Profile) -> None:
        self.close()
        self.console.print(f"[bold]profile verdict: {e.verdict}[/] - {escape(e.why)}")
        for lever in e.levers:
            self.console.print(f"  - {escape(lever)}")
        for name, path in e.artifacts.items():
            self.console.print(f"  {name}: {escape(str(path))}")

    def _on_vram(self, e: ev.Vram) -> None:
        pass  # shown by the console; the bar already carries current memory

    def _on_warning(self, e: ev.WarningEvent) -> None:
        self.close()
        self.console.print(f"[yellow]warning:[/] {escape(e.message)}")

    def _on_error(self, e: ev.ErrorEvent) -> None:
        self.close()
        self.console.print(f"[red]error:[/] {escape(e.message)}")

    def _on_run_end(self, e: ev.RunEnd) -> None:
        self.close()
        m = e.metrics
        summary = ", ".join(f"{k} {v:.3f}" for k, v in m.items()) if m else "no metrics"
        self.console.print(f"[bold]{e.status}[/] after {e.epochs_done} epoch(s) in {fmt_duration(e.time_s)}: {summary}")
        if self._best is not None:
            self._print_per_class(self._best[1], e)
        if e.best:
            self.console.print(f"  best {escape(e.best)}")
        if e.last:
            self.console.print(f"  last {escape(e.last)}")

    def _print_per_class(self, v: ev.Val, end: ev.RunEnd) -> None:
        """The per-class table of the best validation this process saw: best.pt's, unless a resumed run's best came
        before it (then run_end's metrics differ and the title says only the epoch)."""
        same = all(abs(end.metrics.get(k, -1.0) - x) < 1e-9 for k, x in v.metrics.items())
        title = f"per class, epoch {v.epoch + 1}" + (" (best.pt)" if same else "")
        overall = {**v.metrics, "images": v.images}
        if {"precision", "recall", "map50", "map"} <= overall.keys() and v.per_class:
            self.console.print(per_class_table(v.per_class, overall, title))
