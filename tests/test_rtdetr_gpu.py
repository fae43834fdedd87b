"""RT-DETR on a real GPU (run on the device: python -m pytest -m gpu tests/test_rtdetr_gpu.py): the backbone +
encoder graph (cuda_graph=true) against eager steps, and a short training run with cuda_graph=full, which falls
back to that graph with one line naming why."""

import pytest
import torch

from libreyolo.bench.step import _batch_on_device, make_runner
from libreyolo.config import TrainConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEV = torch.device("cuda:0")


def _cfg(**kw):
    return TrainConfig.from_overrides(
        {"model": "LibreRTDETRr18", "batch": 8, "imgsz": 320, "amp": True, "amp_dtype": "float16", "seed": 0, **kw}
    )


def _trajectory(mode, cfg, batches, nc, events=None):
    step, parts = make_runner(cfg, DEV, nc, mode, events.append if events is not None else None)
    out = []
    for i, b in enumerate(batches):
        out.append(step(b["img"], b["targets"], b["mask"], (i + 1) % parts.accumulate == 0).clone())
    torch.cuda.synchronize()
    return torch.stack(out), step


def test_backbone_and_encoder_graph_tracks_eager_steps():
    cfg = _cfg()
    batches = []
    for k in range(10):
        data, nc = _batch_on_device(TrainConfig.from_overrides({**cfg.to_dict(), "seed": k}), cfg.batch, DEV)
        batches.append(data)
    eager, _ = _trajectory("eager", cfg, batches, nc)
    events = []
    graph, runner = _trajectory("graph", cfg, batches, nc, events)
    caps = [e for e in events if e.action == "capture"]
    assert len(caps) == 1 and "features (the rest eager)" in caps[0].reason and not runner.disabled, events
    # the same kernels run either way, but grid_sample's backward adds with atomics (not bitwise reproducible)
    # and the denoising noise and the matching follow: 1% per loss term over 10 steps
    torch.testing.assert_close(graph, eager, rtol=1e-2, atol=1e-3)


def test_training_with_cuda_graph_full_falls_back_to_the_network_graph(tmp_path):
    from libreyolo import LibreYOLO
    from libreyolo.data.shapes import make_shapes
    from libreyolo.events import read_events

    data = make_shapes(tmp_path / "d", 64, 16, 160)
    m = LibreYOLO("LibreRTDETRr18")
    m.train(data=str(data), epochs=2, imgsz=160, batch=8, device=0, cuda_graph="full", workers=2, project=str(tmp_path))
    ev = list(read_events(m.last_run / "events.jsonl"))
    assert ev[-1]["status"] == "finished"
    graph = [e for e in ev if e["type"] == "graph"]
    falls = [e for e in graph if e["action"] == "fallback"]
    assert len(falls) == 1 and "Hungarian matching runs on the host" in falls[0]["reason"], graph
    assert any(e["action"] == "capture" and "features" in e["reason"] for e in graph), graph
    # validation captures the network and runs the matching loss eagerly: no val_graph warning
    assert not [e for e in ev if e["type"] == "warning" and e.get("code") == "val_graph"]
    assert [e["losses"].keys() for e in ev if e["type"] == "epoch_end"][0] == {"vfl", "bbox", "giou"}
