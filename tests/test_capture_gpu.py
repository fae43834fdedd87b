"""The whole-step graph on batches whose objects per image change, and a capture that fails, on a real GPU.

Run on the device: python -m pytest -m gpu tests/test_capture_gpu.py -s"""

import statistics

import pytest
import torch
from conftest import step_batches

from libreyolo.bench.step import make_runner
from libreyolo.config import TrainConfig
from libreyolo.data.dataset import capacity
from libreyolo.engine.fullstep import FullGraphStep

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEV = torch.device("cuda:0")


def _cfg(**kw):
    base = {"model": "LibreYOLO9t", "batch": 8, "imgsz": 320, "amp": True, "nbs": 8, "optimizer": "SGD", "seed": 0}
    return TrainConfig.from_overrides({**base, **kw})


def _targets(batch: int, imgsz: int, n: int, nc: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n random boxes per image (8-64 px), padded to the slots a training batch of them gets (data/dataset.py)."""
    g = torch.Generator().manual_seed(seed)
    slots = capacity(n)
    wh = torch.randint(8, 65, (batch, n, 2), generator=g).float()
    xy = torch.rand(batch, n, 2, generator=g) * (imgsz - wh)
    cls = torch.randint(0, nc, (batch, n, 1), generator=g).float()
    targets = torch.zeros(batch, slots, 5)
    targets[:, :n] = torch.cat((cls, xy, xy + wh), -1)
    mask = torch.zeros(batch, slots, dtype=torch.bool)
    mask[:, :n] = True
    return targets.to(DEV), mask.to(DEV)


def _drive(step, img, plan, nc, timed=6):
    """Steps of the plan's objects per image, in order; -> (median ms of the last `timed` steps, reserved MiB after
    them, with the allocator's cache emptied: what the runner's graphs and pools hold)."""
    times = []
    for k, n in enumerate(plan):
        targets, mask = _targets(img.shape[0], img.shape[1], n, nc, seed=k)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step(img, targets, mask, True)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return statistics.median(times[-timed:]), torch.cuda.memory_reserved(DEV) / 2**20


def _closed(step):
    step.close()
    del step
    torch.cuda.empty_cache()


def test_a_capacity_raised_twice_recaptures_and_ends_like_a_run_captured_there_from_the_start():
    """Objects per image jump 2 -> 40 -> 150 with no bound given (as bench step builds the runner): each jump drops
    the graphs and their pool and captures anew (torch refused a capture into the old pool: `use_count > 0`); the
    steps after the last capture are as fast as, and hold no more memory than, a runner given 152 slots up front."""
    cfg = _cfg()
    (b,), nc = step_batches(cfg, 1, DEV)
    plan = [2] * 5 + [40] * 5 + [150] * 12
    ref_events: list = []
    ref, _ = make_runner(cfg, DEV, nc, "full", ref_events.append, capacity=capacity(150))
    ref_ms, ref_mb = _drive(ref, b["img"], [150] * 12, nc)
    assert [e.action for e in ref_events] == ["capture"], [e.reason for e in ref_events]
    _closed(ref)

    events: list = []
    step, _ = make_runner(cfg, DEV, nc, "full", events.append)
    ms, mb = _drive(step, b["img"], plan, nc)
    assert [e.action for e in events] == ["capture", "invalidate", "recapture", "invalidate", "recapture"], [
        e.reason for e in events
    ]
    assert step.capacity == capacity(150) == 152 and "target capacity 152" in events[-1].reason
    print(f"\nfixed 152: {ref_ms:.2f} ms, {ref_mb:.0f} MiB reserved; raised 4 -> 40 -> 152: {ms:.2f} ms, {mb:.0f} MiB")
    assert ms <= 1.1 * ref_ms and mb <= 1.1 * ref_mb
    _closed(step)


def test_a_whole_step_capture_that_fails_steps_down_to_the_network_graph_and_gives_its_memory_back(monkeypatch):
    """A synchronising call inside the capture invalidates it; torch's capture_end then raises and keeps its
    reference to the pool (graphpool.py). The run steps down with one event, and once the network graph is captured
    the process holds no more memory than a run of the network graph alone."""
    cfg = _cfg()
    (b,), nc = step_batches(cfg, 1, DEV)
    ref, _ = make_runner(cfg, DEV, nc, "graph")
    _, ref_mb = _drive(ref, b["img"], [20] * 8, nc)
    _closed(ref)

    body = FullGraphStep._body

    def syncing_body(self, *args, **kwargs):
        out = body(self, *args, **kwargs)
        if torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()  # not allowed while capturing
        return out

    monkeypatch.setattr(FullGraphStep, "_body", syncing_body)
    events: list = []
    step, _ = make_runner(cfg, DEV, nc, "full", events.append)
    before = torch.cuda.current_stream(DEV)
    _, mb = _drive(step, b["img"], [20] * 10, nc)
    actions = [e.action for e in events]
    assert actions == ["step_down", "capture"], [e.reason for e in events]
    assert events[0].mode == "network" and events[0].reason.startswith("capture failed (")
    assert step.lower is not None and step.lower.graphs and not step.graphs
    assert torch.cuda.current_stream(DEV) == before  # the failed capture's stream is not left current
    print(f"\nnetwork graph alone: {ref_mb:.0f} MiB reserved; after the step-down: {mb:.0f} MiB")
    assert mb <= 1.1 * ref_mb
    _closed(step)


def test_a_run_whose_objects_per_image_jump_captures_its_whole_step_once(tmp_path):
    """Default keys on a set whose train images hold about 2, then 40, then 150 objects: the label scan gives the
    capacity before the first capture (no mosaic in a 2-epoch run: one image's boxes), so the run captures once and
    never re-captures, steps down or falls back."""
    from libreyolo import LibreYOLO
    from libreyolo.data.dense import make_dense
    from libreyolo.events import read_events

    data = make_dense(tmp_path / "jump", n_train=48, n_val=8, size=320, objects=[2, 40, 150])
    model = LibreYOLO("LibreYOLO9t")
    model.train(data=str(data), epochs=2, batch=8, imgsz=320, project=str(tmp_path / "runs"), workers=2)
    events = list(read_events(model.last_run / "events.jsonl"))
    counts = [len(x.splitlines()) for x in (p.read_text() for p in (tmp_path / "jump/labels/train").glob("*.txt"))]
    graph = [e for e in events if e["type"] == "graph"]
    assert [g["action"] for g in graph] == ["capture"], [g["reason"] for g in graph]
    assert f"target capacity {capacity(max(counts))})" in graph[0]["reason"], (max(counts), graph[0]["reason"])
    assert events[-1]["status"] == "finished"
