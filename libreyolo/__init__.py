"""libreyolo: train YOLO-family object detectors fast."""

from typing import Any

__version__ = "0.1.0"
__all__ = ["LibreYOLO", "__version__"]


def __getattr__(name: str) -> Any:
    # lazy: `import libreyolo.events` (the console) must not pay for importing torch
    if name == "LibreYOLO":
        from libreyolo.model import LibreYOLO

        return LibreYOLO
    raise AttributeError(f"module 'libreyolo' has no attribute {name!r}")
