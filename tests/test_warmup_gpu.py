"""The kernel warm-up on a real GPU (run on the device: python -m pytest -m gpu tests/test_warmup_gpu.py)."""

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_the_warm_up_starts_a_float16_run_at_the_scale_the_first_step_probe_finds(tmp_path, monkeypatch):
    """The warm-up reads the start loss scale off the run's first batch on its copy of the train net, before the
    first step; the probe on the train net itself, run at that first step on the same batch, finds the same."""
    from libreyolo import LibreYOLO
    from libreyolo.data.shapes import make_shapes
    from libreyolo.engine import setup as setup_mod
    from libreyolo.engine.lossscale import probe_loss_scale
    from libreyolo.engine.step import NO_PHASES, EagerStep
    from libreyolo.events import read_events

    data = make_shapes(tmp_path / "d", 64, 16, 160)
    probes, late = [], []
    orig = EagerStep.__call__

    def first(self, img, targets, mask, boundary, phases=NO_PHASES):
        if not probes:
            inputs = list(self.flat.proxies.values())
            probes.append(
                probe_loss_scale(self.net, self.forward, self.loss_fn, inputs, img, targets, mask, self.batch_scale)
            )
        return orig(self, img, targets, mask, boundary, phases)

    def first_step_probe(*a, **k):
        late.append(1)
        raise AssertionError("the first step probed the scale again")

    monkeypatch.setattr(EagerStep, "__call__", first)
    monkeypatch.setattr(setup_mod, "start_loss_scale", first_step_probe)
    m = LibreYOLO("LibreYOLO9t")
    m.train(data=str(data), epochs=1, imgsz=160, batch=8, device=0, cuda_graph=False, workers=2, project=str(tmp_path))
    ev = list(read_events(m.last_run / "events.jsonl"))
    assert ev[-1]["status"] == "finished" and late == []
    started = [i for i, e in enumerate(ev) if e["type"] == "amp" and "starts at" in e["reason"]]
    first_step = next(i for i, e in enumerate(ev) if e["type"] == "step")
    assert len(started) == 1 and started[0] < first_step
    scale, exp = probes[0]
    assert exp is not None and ev[started[0]]["scale"] == scale and f"finite up to 2^{exp}" in ev[started[0]]["reason"]
