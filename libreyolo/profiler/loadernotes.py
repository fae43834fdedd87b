"""The why's sentences on the training loader around the window (profiler/window.py): the prefetched batches it
discarded, the drain after them, and an image cache still being filled. They describe how the window was placed,
whatever the verdict; verdict.decide appends them."""

from __future__ import annotations

from typing import Any


def loader_notes(meta: dict[str, Any]) -> str:
    """meta's loader_queue, loader_drain and image_cache (profiler/__init__.py) as sentences, each led by a space."""
    return _queue(meta.get("loader_queue"), meta.get("loader_drain") or {}) + _cache_filling(
        meta.get("image_cache"), meta.get("cache")
    )


def _queue(queue: str | None, drain: dict[str, Any]) -> str:
    if not queue:
        return ""
    text = (
        f" The window started after the loader's {queue} had been consumed: every measured batch was requested "
        "from the loader after the warmup and after any CUDA graph capture."
    )
    if drain.get("waited"):
        n = drain["steps"]
        text += (
            f" It then discarded {n} more step{'s' if n != 1 else ''} until one waited for its batch: the batches "
            "the loader made while the full queue was consumed are not measured either."
        )
    elif drain.get("steps"):
        text += (
            f" No step waited for its batch in the {drain['steps']} after them either: the loader keeps ahead of "
            "the step."
        )
    return text


def _cache_filling(fill: dict[str, int] | None, mode: Any) -> str:
    """An image cache still being filled (cache=auto): the loader's pace was changing."""
    if not fill or fill["held_at_start"] >= fill["images"]:
        return ""
    return (
        f" The image cache (cache={mode}) was being filled: it held {fill['held_at_start']} of the {fill['images']} "
        f"training images when the window started and {fill['held_at_end']} when it ended. The loader decodes only "
        "the images it does not hold yet, so its pace changes until it holds them all (by the end of the first "
        "epoch, which reads every image); cache=ram fills it before training starts."
    )
