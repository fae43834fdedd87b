"""The run's matplotlib figures: results.png, the PR / F1 / P / R curves, the confusion matrix, labels.jpg and the
classifier's top-k accuracy. Each draws on a Figure of its own with the Agg canvas (no pyplot state), so they run on
the plot writer's thread; each writes its file through a temporary name, so a reader never sees half a file."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from libreyolo.atomic import written_whole

DPI = 100
MAX_LEGEND = 10  # classes named in a curve's legend; more are drawn unnamed


def available() -> bool:
    """Whether matplotlib is installed, without importing it (the training process never draws: plots/writer.py)."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def preload() -> None:
    """Import matplotlib and draw one small figure with text (its fonts load then): run at a drawing child's start
    where the writer found matplotlib (available()), since a run's end would otherwise wait for the first picture of
    each child to pay it (0.3-1 s on the CPU machine)."""
    fig = _figure(1, 1, tight=False)
    fig.add_subplot(1, 1, 1).set_title("0")
    fig.canvas.draw()


def _figure(w: float, h: float, tight: bool = True) -> Any:
    """tight=False: fixed margins (tight_layout measures every label: 2 of results.png's 2.5 s on the CPU machine)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=DPI, layout="tight" if tight else None)
    FigureCanvasAgg(fig)
    return fig


def save(fig: Any, path: Path) -> None:
    """Write atomically: the console may be looking at the folder."""
    with written_whole(path) as tmp:
        fig.savefig(tmp, dpi=DPI)


def results(csv_path: Path, out: Path) -> None:
    """results.png: every results.csv column but epoch and time against the epoch, one small plot each."""
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    cols = [c for c in rows[0] if c not in ("epoch", "time")]
    x = [float(r["epoch"]) for r in rows]
    n = len(cols)
    ncol = min(5, n)
    nrow = -(-n // ncol)
    fig = _figure(3.2 * ncol, 2.6 * nrow, tight=False)
    fig.subplots_adjust(left=0.05, right=0.98, top=0.94, bottom=0.06, hspace=0.45, wspace=0.3)
    for k, c in enumerate(cols):
        ax = fig.add_subplot(nrow, ncol, k + 1)
        y = [float(r[c]) if r.get(c) not in (None, "") else np.nan for r in rows]
        ax.plot(x, y, marker="o", markersize=3, linewidth=1.5)
        # a fixed place, high enough for an axis's 1e-5 multiplier: placing it measures every tick label (a quarter of
        # the drawing time)
        ax.set_title(c, fontsize=9, y=1.0, pad=12)
        ax.tick_params(labelsize=7)
        ax.locator_params(nbins=4)  # half the ticks: making them is most of the rest
    save(fig, out)


def _curve_figure() -> Any:
    """A 6 x 4.5 in figure for one curve plot, with fixed margins: its labels are the axes' own (class names are
    in the legend, inside the axes), and tight_layout measuring them was a fifth of each curve's drawing time."""
    fig = _figure(6, 4.5, tight=False)
    fig.subplots_adjust(left=0.1, right=0.97, top=0.93, bottom=0.11)
    return fig


def pr_curve(curves: dict[str, Any], names: list[str], map50: float, out: Path) -> None:
    """PR_curve.png: each class's precision over recall (the evaluator's interpolated curve at IoU 0.5) and their
    mean."""
    fig = _curve_figure()
    ax = fig.add_subplot(1, 1, 1)
    r, p = curves["recall"], curves["precision"]
    _per_class(ax, r, p, names, lambda k: f"{names[k]} {np.nanmean(p[:, k]):.3f}")
    ax.plot(r, np.nanmean(p, 1), linewidth=3, color="tab:blue", label=f"all classes {map50:.3f} mAP@0.5")
    _axes(ax, "Recall", "Precision", "Precision-Recall curve")
    save(fig, out)


def conf_curve(curves: dict[str, Any], names: list[str], key: str, label: str, out: Path) -> None:
    """F1_curve.png, P_curve.png, R_curve.png: the value of the detections kept at each confidence threshold."""
    fig = _curve_figure()
    ax = fig.add_subplot(1, 1, 1)
    x, y = curves["conf"], curves[key]
    _per_class(ax, x, y, names, lambda k: names[k])
    mean = np.nanmean(y, 1) if np.isfinite(y).any() else np.zeros(len(x))
    best = int(np.nanargmax(mean)) if key == "f1" else None
    tag = f" {mean[best]:.2f} at {x[best]:.3f}" if best is not None else ""
    ax.plot(x, mean, linewidth=3, color="tab:blue", label=f"all classes{tag}")
    _axes(ax, "Confidence", label, f"{label}-Confidence curve")
    save(fig, out)


def _per_class(ax: Any, x: np.ndarray, y: np.ndarray, names: list[str], label: Any) -> None:
    named = y.shape[1] <= MAX_LEGEND
    for k in range(y.shape[1]):
        if np.isfinite(y[:, k]).any():
            ax.plot(x, y[:, k], linewidth=1, label=label(k) if named else None, color=None if named else "grey")


def _axes(ax: Any, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, y=1.0)  # a fixed place (nothing sits above the axes): placing it measures the tick labels
    ax.legend(loc="best", fontsize=7)
    ax.grid(alpha=0.3)


def confusion(cm: np.ndarray, names: list[str], normalize: bool, out: Path, background: bool = True) -> None:
    """confusion_matrix.png (counts) or confusion_matrix_normalized.png (each true class's row sums to 1): rows the
    true class, columns the predicted one; with background, the last row and column are the background."""
    labels = list(names) + (["background"] if background else [])
    m = cm.astype(np.float64)
    if normalize:
        m = m / np.maximum(m.sum(1, keepdims=True), 1)
    n = len(labels)
    size = min(4 + 0.45 * n, 16)
    w, h = size + 1.5, size
    # fixed margins wide enough for the longest class name (tight_layout measuring every label and cell was 40% of
    # the drawing time): about 0.07 in per character at the ticks' 8 pt, plus the axis label
    ticks = (0.07 * max(map(len, labels)) if n <= 30 else 0.3) + 0.45
    fig = _figure(w, h, tight=False)
    fig.subplots_adjust(left=min(ticks / w, 0.45), right=0.97, top=1 - 0.45 / h, bottom=min(ticks / h, 0.45))
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(m, cmap="Blues", vmin=0, vmax=1 if normalize else max(float(m.max()), 1.0))
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    if n <= 30:
        ax.set_xticks(range(n), labels, rotation=90, fontsize=8)
        ax.set_yticks(range(n), labels, fontsize=8)
        for i in range(n):
            for j in range(n):
                if m[i, j] > 0:
                    text = f"{m[i, j]:.2f}" if normalize else f"{int(m[i, j])}"
                    color = "white" if m[i, j] > 0.5 * (1 if normalize else m.max()) else "black"
                    ax.text(j, i, text, ha="center", va="center", fontsize=7, color=color)
    ax.set_xlabel("Predicted")
    ax.set_ylabel("True")
    ax.set_title("Confusion matrix" + (" (normalised by true class)" if normalize else ""), y=1.0)
    save(fig, out)


def labels_plot(labels: list[np.ndarray], names: list[str], out: Path) -> None:
    """labels.jpg: instances per class, and the boxes' centres and sizes (normalised to the image) as 2-D
    histograms."""
    lab = np.concatenate(labels).reshape(-1, 5) if labels else np.zeros((0, 5), np.float32)
    fig = _figure(10, 8)
    ax = fig.add_subplot(2, 2, 1)
    counts = np.bincount(lab[:, 0].astype(np.int64), minlength=len(names))[: len(names)]
    ax.bar(range(len(names)), counts, color="tab:blue")
    ax.set_ylabel("instances")
    ax.set_title(f"{len(lab)} boxes in {len(labels)} images")
    if len(names) <= 30:
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=8)
    for k, (a, b, xl, yl) in enumerate(((1, 2, "x", "y"), (3, 4, "width", "height"))):
        ax = fig.add_subplot(2, 2, 3 + k)
        ax.hist2d(lab[:, a], lab[:, b], bins=50, range=[[0, 1], [0, 1]], cmap="Blues")
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.set_title("box centres" if k == 0 else "box sizes")
    ax = fig.add_subplot(2, 2, 2)
    ax.hist(lab[:, 3] * lab[:, 4], bins=50, range=(0, 1), color="tab:blue")
    ax.set_xlabel("box area (fraction of the image)")
    ax.set_ylabel("boxes")
    save(fig, out)


def topk_plot(topk: list[float], out: Path) -> None:
    """topk.png: a classifier's accuracy when the right class is among its best k guesses, k = 1, 2, ..."""
    fig = _figure(6, 4)
    ax = fig.add_subplot(1, 1, 1)
    ks = np.arange(1, len(topk) + 1)
    ax.bar(ks, topk, color="tab:blue")
    for k, v in zip(ks, topk):
        ax.text(k, v + 0.01, f"{v:.3f}", ha="center", fontsize=8)
    ax.set_xticks(ks)
    ax.set_ylim(0, 1.08)
    ax.set_xlabel("k")
    ax.set_ylabel("top-k accuracy")
    ax.set_title("Top-k accuracy")
    save(fig, out)
