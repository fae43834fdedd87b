"""What `libreyolo predict` saves in its folder (runs/predict/exp):

- save=true: each image annotated under its own name; each video (or camera, or stream) as one annotated `.mp4`
  with the source's frame rate and frame size;
- save_txt=true: `labels/<stem>.txt` per image and `labels/<stem>_<frame>.txt` per video frame (frames count from
  0): YOLO lines `class cx cy w h` normalised to the image, with `conf` last under save_conf=true; a classifier's
  lines are `class score`, best first;
- save_json=true: `predictions.json`, COCO results (`image_id`, `category_id`, `bbox` as x, y, w, h in pixels,
  `score`), plus `file_name` and, for video frames, `frame`.

Results arrive one at a time in source order (`stream=True`), so only the current video's writer is open."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from libreyolo.sources import Source, is_video, stream_name

GREEN = (0, 255, 0)


class PredictWriter:
    """Feed it each result (`write`), then `close()`: the last video is finished and predictions.json written."""

    def __init__(
        self,
        out_dir: Path,
        source: Source,
        save: bool = False,
        save_txt: bool = False,
        save_json: bool = False,
        save_conf: bool = False,
    ):
        self.out_dir, self.source = Path(out_dir), source
        self.save, self.save_txt, self.save_json, self.save_conf = save, save_txt, save_json, save_conf
        self.coco: list[dict[str, Any]] = []
        self.frames: dict[str, int] = {}  # frames seen so far per video or stream
        self.count = 0  # results written: names the images passed in memory
        self._video: tuple[str, Any, tuple[int, int]] | None = None  # (source name, cv2.VideoWriter, (w, h))
        if save_txt:
            (self.out_dir / "labels").mkdir(parents=True, exist_ok=True)
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def write(self, r: Any) -> int | None:
        """Save one result; -> its frame number within its video (None for an image)."""
        frame = None
        if r.path is not None and r.path in self.source.videos:
            frame = self.frames.get(r.path, 0)
            self.frames[r.path] = frame + 1
        stem = _stem(r.path, self.count) + (f"_{frame}" if frame is not None else "")
        if self.save:
            self._save_image(r, frame)
        if self.save_txt:
            (self.out_dir / "labels" / f"{stem}.txt").write_text("".join(_txt_lines(r, self.save_conf)))
        if self.save_json:
            self.coco.extend(_coco(r, stem, frame))
        self.count += 1
        return frame

    def close(self) -> None:
        self._end_video()
        if self.save_json:
            with open(self.out_dir / "predictions.json", "w", encoding="utf-8") as f:
                json.dump(self.coco, f)

    def _save_image(self, r: Any, frame: int | None) -> None:
        img = annotate(r)
        if frame is None:
            name = Path(r.path).name if r.path and not is_video(r.path) else f"image{self.count}.jpg"
            cv2.imwrite(str(self.out_dir / name), img)
            return
        if self._video is None or self._video[0] != r.path:
            self._start_video(r.path)
        assert self._video is not None
        _, writer, size = self._video
        if (img.shape[1], img.shape[0]) != size:  # a stream that changed its frame size mid-way
            img = cv2.resize(img, size)
        writer.write(img)

    def _start_video(self, name: str) -> None:
        self._end_video()
        info = self.source.videos[name]
        path = self.out_dir / f"{stream_name(name)}.mp4"
        size = (info.width, info.height)
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), info.fps, size)
        if not writer.isOpened():
            raise OSError(f"OpenCV could not open {path} for writing (mp4v at {info.fps} fps, {size[0]}x{size[1]})")
        self._video = (name, writer, size)

    def _end_video(self) -> None:
        if self._video is not None:
            self._video[1].release()
            self._video = None


def annotate(r: Any) -> np.ndarray:
    """The result's image in OpenCV's BGR order with its boxes and labels drawn; a classifier's top-k lines are
    written in the top-left corner."""
    img: np.ndarray = cv2.cvtColor(r.image, cv2.COLOR_RGB2BGR)
    for i, d in enumerate(r.to_list()):
        x1, y1, x2, y2 = (int(v) for v in d["box"]) if "box" in d else (4, 14 * (i + 1) + 4, 0, 0)
        if "box" in d:
            cv2.rectangle(img, (x1, y1), (x2, y2), GREEN, 2)
        label = f"{d['name']} {d['score']:.2f}"
        cv2.putText(img, label, (x1, max(y1 - 4, 10)), cv2.FONT_HERSHEY_SIMPLEX, 0.45, GREEN, 1)
    return img


def _stem(path: str | None, index: int) -> str:
    if path is None:  # an array passed in memory
        return f"image{index}"
    return stream_name(path)


def _txt_lines(r: Any, save_conf: bool) -> list[str]:
    dets = r.to_list()
    if not dets or "box" not in dets[0]:  # a classifier: its top-k, best first
        return [f"{d['class']} {d['score']:.5f}\n" for d in dets]
    h, w = r.orig_shape
    lines = []
    for d in dets:
        x1, y1, x2, y2 = d["box"]
        vals = [(x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h]
        conf = f" {d['score']:.5f}" if save_conf else ""
        lines.append(f"{d['class']} " + " ".join(f"{v:.6f}" for v in vals) + conf + "\n")
    return lines


def _coco(r: Any, stem: str, frame: int | None) -> list[dict[str, Any]]:
    image_id: int | str = int(stem) if stem.isnumeric() else stem
    base: dict[str, Any] = {"image_id": image_id, "file_name": Path(r.path).name if r.path else stem}
    if frame is not None:
        base["frame"] = frame
    out = []
    for d in r.to_list():
        row = {**base, "category_id": d["class"], "score": round(d["score"], 5)}
        if "box" in d:
            x1, y1, x2, y2 = d["box"]
            row["bbox"] = [round(x1, 3), round(y1, 3), round(x2 - x1, 3), round(y2 - y1, 3)]
        out.append(row)
    return out
