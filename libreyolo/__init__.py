"""libreyolo: train YOLO-family object detectors fast."""

__version__ = "0.1.0"

from libreyolo.model import LibreYOLO  # noqa: E402

__all__ = ["LibreYOLO", "__version__"]
