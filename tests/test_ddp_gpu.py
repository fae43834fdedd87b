"""Multi-GPU paths on real GPUs (`pytest -m gpu`): torchrun at world size 1 on one GPU (NCCL process group,
rank-0 broadcasts and barriers, the whole-step graph with its all-reduce), autobatch's real probe, and, where two
GPUs exist, the spawn launcher with device=0,1 (DDP, SyncBatchNorm, the network graph under DDP)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from libreyolo.events import read_events, validate_event

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


class DistProbe:
    """Callback run inside rank 0 during training: records the live process group and the BatchNorm type."""

    def __init__(self, path):
        self.path = str(path)

    def __call__(self, e):
        if e.type == "run_start":
            import torch.distributed as dist

            with open(self.path, "w") as f:
                json.dump(
                    {
                        "initialized": dist.is_initialized(),
                        "backend": dist.get_backend() if dist.is_initialized() else None,
                        "world": dist.get_world_size() if dist.is_initialized() else None,
                    },
                    f,
                )


def _events(run):
    events = list(read_events(run / "events.jsonl"))
    for e in events:
        validate_event(e)
    return events


def test_torchrun_world_size_1_on_one_gpu(tiny_data, tmp_path):
    """The distributed plumbing on one GPU: NCCL process group, run-dir broadcast, validation broadcast, loss
    mean, final barrier and teardown, and the whole-step graph with its all-reduce (cuda_graph=auto under NCCL).
    On a machine with 2+ GPUs, device="0,1" is passed: under torchrun it must start no processes and use
    cuda:LOCAL_RANK."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from libreyolo import LibreYOLO
        from test_ddp_gpu import DistProbe

        if __name__ == "__main__":
            m = LibreYOLO("LibreYOLO9t")
            m.train(data={str(tiny_data)!r}, project={str(tmp_path / "runs")!r}, epochs=2, imgsz=64, batch=8,
                    workers=2,
                    device="0,1" if __import__("torch").cuda.device_count() > 1 else "0",
                    callbacks=[DistProbe({str(tmp_path / "probe.json")!r})])
            print("RESULT", m.last_run, m.trained, flush=True)
    """)
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", str(script)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    probe = json.loads((tmp_path / "probe.json").read_text())
    assert probe == {"initialized": True, "backend": "nccl", "world": 1}
    run = tmp_path / "runs" / "exp"
    events = _events(run)
    rs = next(e for e in events if e["type"] == "run_start")
    assert (rs["world_size"], rs["batch_per_rank"], rs["device"]) == (1, 8, "cuda:0")
    assert events[-1]["type"] == "run_end" and events[-1]["status"] == "finished"
    assert (run / "weights" / "best.pt").is_file() and "RESULT" in r.stdout
    # the default cuda_graph=auto under DDP over NCCL: the whole step, all-reduce included, in one graph
    assert rs["cuda_graph_mode"] == "full" and "under DDP (1 process, NCCL)" in rs["cuda_graph_reason"], rs
    assert any(e["type"] == "graph" and e["action"] == "capture" for e in events), [
        e for e in events if e["type"] == "graph"
    ]


def test_autobatch_probe_fits_and_restores_batchnorm():
    from libreyolo.config import TrainConfig
    from libreyolo.engine import autobatch
    from libreyolo.families import get_family

    device = torch.device("cuda:0")
    cfg = TrainConfig.from_overrides({})
    fam = get_family("yolo9")
    train_net, loss_fn = autobatch.probe_model(fam, "t", 80, cfg, device)
    before = {k: v.clone() for k, v in train_net.named_buffers()}
    samples, oom = autobatch.probe_memory(train_net, loss_fn, device, 320, torch.float16)
    assert oom is None and [b for b, _ in samples] == list(autobatch.PROBE_SIZES)
    assert samples[-1][1] > samples[0][1], samples  # memory grows with batch
    assert all(torch.equal(v, before[k]) for k, v in train_net.named_buffers())
    b1, line = autobatch.autobatch(train_net, loss_fn, device, 320, torch.float16, world_size=1, nbs=10_000)
    b2, _ = autobatch.autobatch(train_net, loss_fn, device, 320, torch.float16, world_size=2, nbs=64)
    assert b1 >= 16 and "autobatch: batch=" in line
    assert b2 % 2 == 0 and b2 <= 64


def test_batch_minus_one_on_one_gpu_trains_at_the_autobatch_size(tiny_data, tmp_path):
    from libreyolo import LibreYOLO

    m = LibreYOLO("LibreYOLO9t")
    m.train(data=str(tiny_data), project=str(tmp_path), epochs=1, imgsz=64, batch=-1, nbs=32, workers=2, device="0")
    events = _events(m.last_run)
    rs = next(e for e in events if e["type"] == "run_start")
    assert rs["batch"] == 32  # a 64-px tiny model fits far more than nbs on any GPU: the cap decides
    assert any(e["type"] == "warning" and e["message"].startswith("autobatch: batch=32") for e in events)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_spawn_launch_on_two_gpus(tiny_data, tmp_path):
    from libreyolo import LibreYOLO

    m = LibreYOLO("LibreYOLO9t")
    m.train(
        data=str(tiny_data),
        project=str(tmp_path),
        epochs=2,
        imgsz=64,
        batch=8,
        workers=2,
        device="0,1",
        cuda_graph=True,
        callbacks=[DistProbe(tmp_path / "probe.json")],
    )
    assert json.loads((tmp_path / "probe.json").read_text()) == {"initialized": True, "backend": "nccl", "world": 2}
    events = _events(m.last_run)
    rs = next(e for e in events if e["type"] == "run_start")
    assert (rs["world_size"], rs["batch_per_rank"]) == (2, 4) and m.trained
    # cuda_graph=true under DDP over NCCL: the network graph on both ranks, the all-reduce after its backward
    assert rs["cuda_graph_mode"] == "true" and "under DDP (2 processes, NCCL)" in rs["cuda_graph_reason"], rs
    graphs = [e for e in events if e["type"] == "graph"]
    assert any(g["action"] == "capture" for g in graphs) and not any(g["action"] == "fallback" for g in graphs), graphs


def test_full_step_with_captured_all_reduce_equals_the_plain_full_step():
    """One NCCL rank in this process: the whole-step graph with the flat-gradient all-reduce captured in it gives
    the same loss trajectory and weights, bit for bit, as the same graph without DDP (an all-reduce over one rank
    is the identity; everything else is the same kernels), over 24 steps with gradient accumulation and fp16."""
    from test_graphs_gpu import DEV, _batches, _cfg

    from libreyolo.bench.step import _single_rank_group, make_runner

    cfg = _cfg()
    batches, nc = _batches(cfg, 24)

    def trajectory(ddp):
        events = []
        step, parts = make_runner(cfg, DEV, nc, "full", events.append, ddp)
        losses = [
            step(b["img"], b["targets"], b["mask"], (i + 1) % parts.accumulate == 0).clone()
            for i, b in enumerate(batches)
        ]
        torch.cuda.synchronize()
        assert any(e.action == "capture" for e in events) and not step.disabled, [e.reason for e in events]
        return torch.stack(losses), parts

    plain, pp = trajectory(None)
    ctx = _single_rank_group("0")
    try:
        assert (ctx.backend, ctx.world_size) == ("nccl", 1)
        ddp, pd = trajectory(ctx)
    finally:
        ctx.finish()
        ctx.close()
    assert torch.equal(plain, ddp), (plain - ddp).abs().max()
    for (k, a), b in zip(pp.train_net.state_dict().items(), pd.train_net.state_dict().values()):
        assert torch.equal(a, b), k
