"""CUDA-graph and AMP behaviour on a real GPU (run on the device: python -m pytest -m gpu tests/test_graphs_gpu.py)."""

import os

import pytest
import torch
from conftest import step_batches, step_trajectory

from libreyolo.bench.step import make_runner
from libreyolo.config import TrainConfig
from libreyolo.nn import streams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEV = torch.device("cuda:0")


@pytest.fixture(autouse=True)
def _deterministic():
    """Bitwise comparisons need the same kernels in both runs: no cuDNN autotuning, deterministic algorithms."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    prev = (
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.are_deterministic_algorithms_enabled(),
    )
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
    torch.use_deterministic_algorithms(True)
    yield
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = prev[:2]
    torch.use_deterministic_algorithms(prev[2])


def _cfg(**kw):
    return TrainConfig.from_overrides(
        {
            "model": "LibreYOLO9t",
            "batch": 8,
            "imgsz": 320,
            "amp": True,
            "amp_dtype": "float16",
            "nbs": 16,
            "optimizer": "SGD",
            "lr0": 0.01,
            "seed": 0,
            **kw,
        }
    )


def _batches(cfg, n):
    """n different real batches (mosaic, built-in dataset), fixed across runs."""
    return step_batches(cfg, n, DEV)


def _trajectory(mode, cfg, batches, nc, events=None):
    return step_trajectory(mode, cfg, batches, nc, DEV, events)


def test_network_graph_reproduces_eager_bitwise_under_amp_with_accumulation():
    cfg = _cfg()
    batches, nc = _batches(cfg, 24)
    eager, pe, _ = _trajectory("eager", cfg, batches, nc)
    events = []
    forked = streams.side_branches()
    graph, pg, runner = _trajectory("graph", cfg, batches, nc, events)
    assert any(e.action == "capture" for e in events), [e.reason for e in events]
    assert runner.graphs, "nothing was captured"
    # the capture put the network's independent branches on side streams (nn/streams.py), and still matches eager
    assert streams.side_branches() > forked or not streams.ENABLED
    assert torch.equal(eager, graph), (eager - graph).abs().max()
    # real gradient accumulation (nbs=16 at batch 8: 2 micro-steps per update) gives the same weights,
    # and BatchNorm statistics after the warm-up/capture steps equal eager ones
    for (k, a), b in zip(pe.train_net.state_dict().items(), pg.train_net.state_dict().values()):
        assert torch.equal(a, b), k


def test_full_step_capture_tracks_eager_within_tolerance():
    cfg = _cfg()
    batches, nc = _batches(cfg, 24)
    eager, _, _ = _trajectory("eager", cfg, batches, nc)
    events = []
    full, _, runner = _trajectory("full", cfg, batches, nc, events)
    assert any(e.action == "capture" for e in events), [e.reason for e in events]
    assert not runner.disabled
    # different kernels for the same math (flat gradient buffer, foreach update with device-tensor LR):
    # float rounding, so a tolerance instead of bitwise equality
    torch.testing.assert_close(full, eager, rtol=2e-2, atol=2e-3)


def test_multiscale_captures_only_the_repeated_shape():
    cfg = _cfg(imgsz=256)
    big, nc = _batches(cfg, 1)
    small, _ = _batches(_cfg(imgsz=192), 1)
    events = []
    step, parts = make_runner(cfg, DEV, nc, "graph", events.append)
    seq = [big, big, small, big, big, big, small, big]
    for b in seq:
        step(b[0]["img"], b[0]["targets"], b[0]["mask"], True)
    torch.cuda.synchronize()
    assert [k[1] for k in step.graphs] == [256]
    assert [e.action for e in events].count("capture") == 1
    assert any(e.action == "eager_shape" and e.shape[1] == 192 for e in events)


def test_capture_event_reports_plausible_vram_delta():
    cfg = _cfg(batch=8, imgsz=640)
    batches, nc = _batches(cfg, 1)
    events = []
    step, _ = make_runner(cfg, DEV, nc, "full", events.append)
    for _ in range(4):
        step(batches[0]["img"], batches[0]["targets"], batches[0]["mask"], True)
    cap = [e for e in events if e.action == "capture"]
    assert cap, [e.reason for e in events]
    e = cap[0]
    assert e.allocated_after_mb >= e.allocated_before_mb and 0 < e.delta_reserved_mb < 8192
    assert e.delta_allocated_mb == pytest.approx(e.allocated_after_mb - e.allocated_before_mb)


@pytest.mark.parametrize("mode", [True, "full"])
def test_trainer_runs_with_graphs_on_gpu(tmp_path, mode):
    from libreyolo import LibreYOLO
    from libreyolo.data.shapes import make_shapes
    from libreyolo.events import read_events

    data = make_shapes(tmp_path / "d", 64, 16, 160)
    m = LibreYOLO("LibreYOLO9t")
    m.train(
        data=str(data),
        epochs=2,
        imgsz=160,
        batch=8,
        device=0,
        cuda_graph=mode,
        workers=2,
        project=str(tmp_path / "runs"),
    )
    ev = list(read_events(m.last_run / "events.jsonl"))
    assert ev[-1]["status"] == "finished"
    assert any(e["type"] == "graph" and e["action"] == "capture" for e in ev), [e for e in ev if e["type"] == "graph"]
    assert any(e["type"] == "vram" for e in ev)


def test_a_capture_plan_of_submodules_captures_them_and_runs_the_rest_eager_bitwise():
    """cuda_graph=true with a plan naming two submodules (engine/subgraphs.py): each is replayed from its own
    forward and backward graphs inside the eager step, and training is bitwise the eager one."""
    import dataclasses

    from libreyolo.engine.components import build_step_parts
    from libreyolo.engine.runners import select_step
    from libreyolo.families import CapturePlan, parse_model_name

    cfg = _cfg()
    batches, nc = _batches(cfg, 24)
    eager, pe, _ = _trajectory("eager", cfg, batches, nc)
    fam, size = parse_model_name(cfg.model)
    fam = dataclasses.replace(fam, capture=CapturePlan(("net.stem", "net.b4")))
    torch.manual_seed(cfg.seed)
    parts = build_step_parts(fam, fam.build(size, nc), cfg, DEV, cfg.batch, 10_000_000)
    cfg.cuda_graph = True
    events = []
    step, mode, _ = select_step(parts.eager_step(cfg.grad_clip), parts, cfg, fam, DEV, 1, events.append)
    losses = [
        step(b["img"], b["targets"], b["mask"], (i + 1) % parts.accumulate == 0).clone() for i, b in enumerate(batches)
    ]
    torch.cuda.synchronize()
    caps = [e for e in events if e.action == "capture"]
    assert (
        mode is True and len(caps) == 1 and "net.stem, net.b4 (the rest eager)" in caps[0].reason and not step.disabled
    )
    assert torch.equal(eager, torch.stack(losses)), (eager - torch.stack(losses)).abs().max()
    for (k, a), b in zip(pe.train_net.state_dict().items(), parts.train_net.state_dict().values()):
        assert torch.equal(a, b), k


@pytest.mark.parametrize("mode", [False, True, "full"])
def test_an_epoch_end_queues_its_reads_and_last_pt_without_waiting_for_the_gpu(tmp_path, monkeypatch, mode):
    """An epoch's end copies its losses, skipped steps and loss scale, and last.pt's optimizer, EMA and scaler counters,
    behind the queued steps (HostRead, the checkpoint's snapshot): under torch.cuda.set_sync_debug_mode("error") an
    epoch end without validation raises nothing. last.pt's counters are the run's: one EMA update per optimizer step,
    and an AdamW step for each of them the loss scaler did not skip."""
    from libreyolo import LibreYOLO
    from libreyolo.data.shapes import make_shapes
    from libreyolo.engine import trainer as trainer_mod
    from libreyolo.engine.checkpoint import load_checkpoint
    from libreyolo.events import read_events

    orig = trainer_mod.Trainer._end_epoch
    strict: list[int] = []

    def end(self, epoch):
        if epoch == self.cfg.epochs - 1:  # the final epoch validates: its thread reads its results back
            return orig(self, epoch)
        self.vals._join_warm()  # the validation graph's warm-up thread reads the device: not inside the strict window
        torch.cuda.set_sync_debug_mode("error")
        try:
            orig(self, epoch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        strict.append(epoch)

    monkeypatch.setattr(trainer_mod.Trainer, "_end_epoch", end)
    data = make_shapes(tmp_path / "d", 64, 16, 160)
    m = LibreYOLO("LibreYOLO9t")
    keys = dict(epochs=3, imgsz=160, batch=8, nbs=8, optimizer="AdamW", amp_dtype="float16", val=False, workers=2)
    m.train(data=str(data), device=0, cuda_graph=mode, project=str(tmp_path / "runs"), **keys)
    assert strict == [0, 1]
    events = list(read_events(m.last_run / "events.jsonl"))
    assert events[-1]["status"] == "finished"
    amps = [e for e in events if e["type"] == "amp" and e["epoch"] is not None]
    assert [e["epoch"] for e in amps] == [0, 1, 2]
    skipped = sum(e["skipped_steps"] for e in amps)
    train = load_checkpoint(m.last_run / "weights" / "last.pt")["train"]
    assert int(train["ema"]["updates"]) == 3 * 8  # 64 images, batch 8, a step per batch
    assert {float(st["step"]) for st in train["optimizer"]["state"].values()} == {3 * 8 - skipped}
    assert float(train["scaler"]["scale"]) == amps[-1]["scale"]
