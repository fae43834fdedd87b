"""YOLOX on a real GPU (run on the device: python -m pytest -m gpu tests/test_yolox_gpu.py): the loss never
synchronises, both graph modes train it, and the L1 switch re-captures the graph once."""

import pytest
import torch

from libreyolo.bench.step import _batch_on_device, make_runner
from libreyolo.config import TrainConfig
from libreyolo.families.yolox.loss import YOLOXLoss
from libreyolo.families.yolox.network import YOLOX

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEV = torch.device("cuda:0")


def _cfg(**kw):
    return TrainConfig.from_overrides(
        {
            "model": "LibreYOLOXn",
            "batch": 8,
            "imgsz": 320,
            "amp": True,
            "amp_dtype": "float16",
            "nbs": 16,
            "seed": 0,
            **kw,
        }
    )


@pytest.mark.parametrize("use_l1", [False, True])
def test_loss_never_synchronises_on_cuda(use_l1):
    torch.manual_seed(0)
    net = YOLOX("n", 3).to(DEV)
    loss = YOLOXLoss(3)
    loss.use_l1 = use_l1
    cfg = _cfg()
    data, _ = _batch_on_device(cfg, 8, DEV)
    x = data["img"].permute(0, 3, 1, 2).float().div(255)
    args = (data["targets"], data["mask"], (320, 320), 8.0)
    total, _ = loss(net(x), *args)  # first call: allocator, cuBLAS and anchor-cache set-up happen here
    total.backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        total, items = loss(net(x), *args)
        total.backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(items).all() and (float(items[3]) > 0) == use_l1


def test_full_step_capture_tracks_eager():
    cfg = _cfg()
    batches = []
    for k in range(16):
        data, nc = _batch_on_device(TrainConfig.from_overrides({**cfg.to_dict(), "seed": k}), cfg.batch, DEV)
        batches.append(data)
    out = {}
    for mode in ("eager", "full"):
        events = []
        step, parts = make_runner(TrainConfig.from_overrides(cfg.to_dict()), DEV, nc, mode, events.append)
        out[mode] = torch.stack(
            [
                step(b["img"], b["targets"], b["mask"], (i + 1) % parts.accumulate == 0).clone()
                for i, b in enumerate(batches)
            ]
        )
        torch.cuda.synchronize()
        if mode == "full":
            assert any(e.action == "capture" for e in events) and not step.disabled, [e.reason for e in events]
    # the first steps agree within float rounding; later, rounding differences between the two updates flip a
    # few of SimOTA's discrete choices (its top-k and the floor of dynamic k), so the runs drift apart slowly
    # (seen on the H200: 3 of 64 terms off by up to 11% at step 15): the later steps are compared in the mean
    torch.testing.assert_close(out["full"][:8], out["eager"][:8], rtol=2e-2, atol=2e-3)
    drift = ((out["full"] - out["eager"]).abs() / out["eager"].abs().clamp(min=1e-3)).mean()
    assert drift < 0.02, drift


@pytest.mark.parametrize("mode", [True, "full"])
def test_trainer_recaptures_once_when_the_l1_term_turns_on(tmp_path, mode):
    from libreyolo import LibreYOLO
    from libreyolo.data.shapes import make_shapes
    from libreyolo.events import read_events

    data = make_shapes(tmp_path / "d", 64, 16, 160)
    m = LibreYOLO("LibreYOLOXn")
    m.train(
        data=str(data),
        epochs=2,
        no_aug_epochs=1,
        imgsz=160,
        batch=8,
        nbs=8,
        device=0,
        cuda_graph=mode,
        workers=2,
        project=str(tmp_path / "runs"),
    )
    ev = list(read_events(m.last_run / "events.jsonl"))
    assert ev[-1]["status"] == "finished"
    graph = [e for e in ev if e["type"] == "graph"]
    assert all(g["action"] != "fallback" for g in graph), graph
    # (the full-step runner may also invalidate while mosaic raises its target capacity: other reasons)
    l1 = [i for i, g in enumerate(graph) if g["action"] == "invalidate" and g["reason"].startswith("L1 loss on")]
    assert len(l1) == 1 and graph[l1[0]]["reason"] == "L1 loss on at epoch 2", graph
    after = [g for g in graph[l1[0] :] if g["action"] == "recapture"]
    assert after and after[0]["reason"].startswith("re-captured: L1 loss on at epoch 2"), graph
    losses = [e["losses"] for e in ev if e["type"] == "epoch_end"]
    assert losses[0]["l1"] == 0.0 and losses[1]["l1"] > 0.0
