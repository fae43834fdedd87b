"""The pictures a run leaves in its folder: results.png, the PR / F1 / P / R curves, the confusion matrices,
labels.jpg, the training and validation mosaics, and a classifier's top-k and misclassified images. `PlotWriter`
(writer.py) is what the training loop hands its material to; it draws on a thread of its own. docs/quickstart.md
lists the files."""

from libreyolo.plots.writer import PlotWriter

__all__ = ["PlotWriter"]
