"""predict on videos and streams (issue 54): a video in, an annotated video out with the same frames, size and
frame rate, YOLO labels per frame and COCO results; stream=True hands results on one frame at a time with flat
memory; folders of images and videos, globs, cameras and URLs as sources."""

from __future__ import annotations

import functools
import http.server
import json
import re
import threading
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch
from torch import nn

from libreyolo import LibreYOLO
from libreyolo.cli.main import main
from libreyolo.errors import DataError
from libreyolo.predict import PredictStream, UnreadableImageWarning, run_predict
from libreyolo.sources import open_source

NAMES = ["circle", "square", "triangle"]


def make_video(path: Path, frames: int, size: tuple[int, int], fps: float) -> Path:
    """An mp4 whose frame k shows a square at x = k (mod 20): frames differ, as a real video's do."""
    w, h = size
    out = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), fps, (w, h))
    assert out.isOpened()
    for k in range(frames):
        img = np.full((h, w, 3), 40, np.uint8)
        cv2.rectangle(img, (4 + k % 20, 8), (4 + k % 20 + w // 3, 8 + h // 2), (0, 200, 255), -1)
        out.write(img)
    out.release()
    return path


def video_props(path: Path) -> tuple[int, float, int, int]:
    cap = cv2.VideoCapture(str(path))
    try:
        assert cap.isOpened(), path
        n = 0
        while cap.read()[0]:
            n += 1
        return (
            n,
            cap.get(cv2.CAP_PROP_FPS),
            int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)),
            int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)),
        )
    finally:
        cap.release()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    m = LibreYOLO("LibreYOLO9t", nc=3, names=NAMES)
    m.imgsz = 64
    return m.save(tmp_path_factory.mktemp("ckpt") / "m.pt")


def test_predict_on_a_video_saves_its_frames_labels_and_coco_results(checkpoint, tmp_path, capsys, monkeypatch):
    clip = make_video(tmp_path / "clip.mp4", 30, (96, 64), 15.0)
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich draws the progress bar as on a terminal
    argv = ["predict", f"model={checkpoint}", f"source={clip}", "device=cpu", "conf=0", "max_det=4"]
    argv += ["save=true", "save_txt=true", "save_json=true", f"project={tmp_path / 'out'}"]
    assert main(argv) == 0
    cap = capsys.readouterr()
    out = tmp_path / "out" / "exp"
    assert video_props(out / "clip.mp4") == (30, 15.0, 96, 64)  # every frame, the source's rate and size
    assert "30/30 frames" in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", cap.err)  # the bar counted the video's frames
    assert [line.split(":")[0] for line in cap.out.splitlines()[:2]] == [f"{clip} frame 0", f"{clip} frame 1"]

    labels = sorted((out / "labels").glob("*.txt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    assert [p.name for p in labels] == [f"clip_{k}.txt" for k in range(30)]
    rows = [[float(v) for v in line.split()] for p in labels for line in p.read_text().splitlines()]
    assert rows and all(len(r) == 5 and r[0] in (0, 1, 2) and all(0 <= v <= 1 for v in r[1:]) for r in rows)

    coco = json.loads((out / "predictions.json").read_text())
    assert len(coco) == len(rows)  # the same detections in both
    assert {d["image_id"] for d in coco} <= {f"clip_{k}" for k in range(30)}
    assert all(d["image_id"] == f"clip_{d['frame']}" for d in coco)
    for d in coco:
        x, y, w, h = d["bbox"]
        assert 0 <= x <= x + w <= 96 and 0 <= y <= y + h <= 64 and 0 <= d["score"] <= 1

    # the API gives the same boxes for the same frames: frame 7's labels are its detections, normalised
    res = LibreYOLO(str(checkpoint)).predict(clip, device="cpu", conf=0, max_det=4)
    assert len(res) == 30 and all(r.path == str(clip) for r in res)
    boxes = res[7].boxes.numpy()
    want = np.stack([(boxes[:, 0] + boxes[:, 2]) / 192, (boxes[:, 1] + boxes[:, 3]) / 128], 1)
    got = np.loadtxt(out / "labels" / "clip_7.txt", ndmin=2)[:, 1:3]
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_stream_yields_one_frame_at_a_time_with_flat_memory(tmp_path):
    """1,000 frames through the real reading, batching and result path; the network is a 1x1 convolution and its
    output one fixed box per image, so the test measures what predict keeps, not what a detector costs on CPU."""
    clip = make_video(tmp_path / "long.mp4", 1000, (48, 48), 25.0)

    def postprocess(net, out, imgsz, **kw):
        b = out.shape[0]
        return torch.tensor([[i, 2.0, 2.0, 20.0, 20.0, 0.9, 1.0] for i in range(b)])

    stub = SimpleNamespace(net=nn.Conv2d(3, 1, 1), family=SimpleNamespace(postprocess=postprocess), names=NAMES)
    results = run_predict(stub, clip, imgsz=32, device="cpu", stream=True)
    assert isinstance(results, PredictStream)
    tracemalloc.start()
    try:
        for k, r in enumerate(results):
            assert r.image.shape == (48, 48, 3) and len(r) == 1
            if k == 99:
                at_100 = tracemalloc.get_traced_memory()[0]
        grown = tracemalloc.get_traced_memory()[0] - at_100
    finally:
        tracemalloc.stop()
    assert k == 999
    # holding the 900 later frames (48 x 48 x 3 bytes each) would add 6.2 MB
    assert grown < 500_000, f"memory grew {grown / 1e6:.2f} MB over 900 streamed frames"


def test_a_folder_of_images_and_videos_and_a_glob(checkpoint, tiny_data, tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    img = sorted((tiny_data.parent / "images" / "val").glob("*.jpg"))[0]
    (folder / "a.jpg").write_bytes(img.read_bytes())
    make_video(folder / "b.mp4", 5, (64, 64), 10.0)
    (folder / "c.mp4").write_bytes(b"not a video")  # unreadable: skipped with a warning, like a broken image
    (folder / "notes.txt").write_text("ignored: neither an image nor a video")
    model = LibreYOLO(str(checkpoint))
    with pytest.warns(UnreadableImageWarning, match="c.mp4"):
        res = model.predict(folder, device="cpu")
    assert [Path(r.path).name for r in res] == ["a.jpg"] + ["b.mp4"] * 5
    assert [Path(f).name for f, _ in res.skipped] == ["c.mp4"]
    src = open_source(str(folder / "*.mp4"))
    assert [e.path for e in src.entries] == [str(folder / "b.mp4"), str(folder / "c.mp4")]
    assert not src.live and src.total == 6  # 5 frames, and the unreadable file counted once
    with pytest.raises(DataError, match=r"nothing\*.mp4: the pattern matches no image or video"):
        open_source(str(folder / "nothing*.mp4"))


def test_cameras_and_urls_are_live_sources(monkeypatch):
    for given, kind in ((0, "camera"), ("3", "camera"), ("rtsp://10.0.0.1/cam", "url"), ("http://h/x.mjpg", "url")):
        src = open_source(given)
        assert [e.kind for e in src.entries] == [kind] and src.live and src.total is None

    class NoCamera:  # what OpenCV gives for a camera index with no device behind it
        def __init__(self, *a):
            pass

        def isOpened(self):
            return False

        def release(self):
            pass

    monkeypatch.setattr(cv2, "VideoCapture", NoCamera)
    with pytest.raises(DataError, match="source camera3: OpenCV could not open the camera"):
        list(open_source("3"))


def test_a_stream_url_is_predicted_frame_by_frame_and_recorded(checkpoint, tmp_path, capsys):
    """An http:// source through OpenCV's FFmpeg: a live stream (no known length, batches of 1), recorded at the
    rate and size the stream reports."""
    make_video(tmp_path / "cam.mp4", 12, (64, 48), 10.0)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/cam.mp4"
    try:
        argv = ["predict", f"model={checkpoint}", f"source={url}", "device=cpu", "save=true"]
        assert main([*argv, f"project={tmp_path / 'out'}"]) == 0
    finally:
        server.shutdown()
    assert video_props(tmp_path / "out" / "exp" / "cam.mp4") == (12, 10.0, 64, 48)
    assert capsys.readouterr().out.splitlines()[11].startswith(f"{url} frame 11: ")


def test_a_classifier_streams_and_saves_its_top_k(tmp_path):
    from libreyolo.sources.outputs import PredictWriter

    clip = make_video(tmp_path / "c.mp4", 4, (64, 48), 8.0)
    torch.manual_seed(0)
    model = LibreYOLO("LibreResNet18", nc=3, names=NAMES)
    src = open_source(clip)
    writer = PredictWriter(tmp_path / "out", src, save=True, save_txt=True, save_json=True)
    for r in model.predict(src, stream=True, imgsz=32, device="cpu", top_k=2):
        writer.write(r)
    writer.close()
    assert video_props(tmp_path / "out" / "c.mp4") == (4, 8.0, 64, 48)
    lines = (tmp_path / "out" / "labels" / "c_3.txt").read_text().splitlines()
    assert len(lines) == 2 and {int(line.split()[0]) for line in lines} <= {0, 1, 2}
    coco = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert len(coco) == 8 and all("bbox" not in d for d in coco)
