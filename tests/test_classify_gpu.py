"""Classifiers under CUDA graphs (run on the device: python -m pytest -m gpu tests/test_classify_gpu.py)."""

import pytest
import torch
from conftest import step_batches, step_trajectory

from libreyolo.config import TrainConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEV = torch.device("cuda:0")


def _cfg(model: str, **kw):
    base = {"model": model, "batch": 32, "imgsz": 224, "amp": True, "amp_dtype": "float16", "nbs": 64, "seed": 0}
    return TrainConfig.from_overrides({**base, "optimizer": "SGD", "lr0": 0.01, **kw})


@pytest.mark.parametrize("model", ["LibreResNet18", "LibreMNv4s"])
def test_full_step_capture_of_a_classifier_tracks_eager(model):
    """The whole step (forward, cross-entropy, backward, optimizer, EMA) as one graph: captured, never given up,
    and its losses follow the eager ones over 24 steps of real random-resized-crop batches."""
    cfg = _cfg(model)
    batches, nc = step_batches(cfg, 24, DEV)
    assert int(batches[0]["mask"][:, 0].sum()) == cfg.batch  # every image carries its class at targets[:, 0, 0]
    eager, _, _ = step_trajectory("eager", cfg, batches, nc, DEV)
    events = []
    full, _, runner = step_trajectory("full", cfg, batches, nc, DEV, events)
    assert any(e.action == "capture" for e in events), [e.reason for e in events]
    assert not runner.disabled
    assert torch.isfinite(eager).all() and eager[-1] < eager[0]  # it learns
    torch.testing.assert_close(full, eager, rtol=2e-2, atol=2e-3)
