"""The overlapped eager step on a real GPU (run on the device: python -m pytest -m gpu tests/test_overlap_gpu.py).

On a GPU the backward's kernels come from autograd's device thread while the next forward's come from the loop's
thread, interleaved on one stream: the training must still be the plain step's."""

import pytest
import torch
from conftest import step_batches

from libreyolo.config import TrainConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEV = torch.device("cuda:0")


def test_overlapped_eager_step_trains_like_the_plain_one_on_a_gpu():
    from libreyolo.bench.step import make_runner

    cfg = TrainConfig.from_overrides({"model": "LibreYOLO9t", "imgsz": 320, "batch": 4, "nbs": 16, "device": "0"})
    batches, nc = step_batches(cfg, 8, DEV)
    torch.backends.cudnn.deterministic = True
    try:
        runs = []
        for overlap in (False, True):
            step, parts = make_runner(cfg, DEV, nc, "eager")
            assert step.overlap_backward  # the rule turns it on for this run (CUDA, flat, 4 micro-steps)
            step.overlap_backward = overlap
            losses = [
                step(b["img"], b["targets"], b["mask"], (i + 1) % parts.accumulate == 0) for i, b in enumerate(batches)
            ]
            step.sync()
            torch.cuda.synchronize()
            runs.append((torch.stack(losses), [p.detach().clone() for p in parts.train_net.parameters()]))
    finally:
        torch.backends.cudnn.deterministic = False
    (la, pa), (lb, pb) = runs
    assert torch.isfinite(la).all()
    # a few loss kernels add with atomics (their order is the GPU's), so not bit for bit: a gradient lost or
    # doubled by the overlap would move the weights far more than that rounding
    torch.testing.assert_close(lb, la, rtol=1e-4, atol=1e-5)
    for a, b in zip(pa, pb):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
