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


def test_backbone_and_encoder_graph_replays_what_eager_computes():
    """After the capture (3rd step), the replayed backbone + encoder give the eager forward's outputs and add the
    eager backward's weight gradients, for the same weights and input. (Whole-step trajectories are not compared:
    grid_sample's backward adds with atomics and the Hungarian matching turns those last bits into different
    assignments.) The network input gets no captured input gradient."""
    from libreyolo.nn.inputs import normalize

    cfg = _cfg()
    data, nc = _batch_on_device(cfg, cfg.batch, DEV)
    events = []
    step, parts = make_runner(cfg, DEV, nc, "graph", events.append)
    for _ in range(3):
        step(data["img"], data["targets"], data["mask"], True)
    torch.cuda.synchronize()
    caps = [e for e in events if e.action == "capture"]
    assert len(caps) == 1 and "features (the rest eager)" in caps[0].reason and not step.disabled, events
    graphs = next(iter(step.graphs.values()))
    g, module = graphs["features"], step.parts.modules["features"]
    assert g.grad_x is None and not g.x.requires_grad

    x = normalize(data["img"], parts.channels_last)
    flat = parts.flat
    own = {n[len("features.") :]: p for n, p in flat.proxies.items() if n.startswith("features.")}
    masters = dict(zip(flat.names, flat.params))

    def as_tuple(o):
        return (o,) if isinstance(o, torch.Tensor) else tuple(o)

    # eager: the module's own forward on the half-precision stand-ins, gradients taken for the stand-ins
    with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False):
        eager_outs = as_tuple(torch.func.functional_call(module, own, (x,)))
    seed = [torch.full_like(o, 1e-3) for o in eager_outs]
    eager_grads = torch.autograd.grad(eager_outs, list(own.values()), seed, allow_unused=True)
    # graph: the replayed forward, and the replayed backward adding into the flat gradient buffer
    flat.zero_grad()
    with step.parts.active(graphs):
        graph_outs = as_tuple(module(x))
    torch.autograd.backward(graph_outs, seed)
    torch.cuda.synchronize()
    for a, b in zip(graph_outs, eager_outs):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2)
    pairs = [(masters["features." + n].grad, e.float()) for n, e in zip(own, eager_grads) if e is not None]
    scale = max(e.abs().max().item() for _, e in pairs)
    worst = max((a - e).abs().max().item() for a, e in pairs)
    assert scale > 0 and worst <= 2e-2 * scale, (worst, scale)


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
