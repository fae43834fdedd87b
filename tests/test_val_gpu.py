"""Batched NMS and the validator on a real GPU (run on the device: python -m pytest -m gpu tests/test_val_gpu.py -s).

On CUDA the batched NMS must still equal its per-image definition bit for bit (both run the same torchvision
kernel on the same shifted boxes); CPU and CUDA may differ in a last-bit IoU at the threshold (the CUDA kernel
may fuse multiply-adds), so they are compared by counts only. Prints the postprocess time per batch."""

import dataclasses
import time

import pytest
import torch

from libreyolo.nn.nms import nms_packed, nms_packed_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEV = torch.device("cuda:0")


def _untrained_outputs(batch: int, imgsz: int, nc: int):
    from libreyolo.families.yolo9.network import YOLO9

    torch.manual_seed(0)
    net = YOLO9("t", nc).to(DEV).eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        raw = net(torch.rand(batch, 3, imgsz, imgsz, device=DEV))
    pred = net.head.decode(raw.float(), net.feature_shapes(imgsz, imgsz))
    return pred[..., :4], pred[..., 4:]


@pytest.mark.parametrize("nc", [3, 80])
def test_batched_nms_equals_the_reference_on_cuda(nc):
    boxes, scores = _untrained_outputs(16, 640, nc)
    for multi_label in (True, False):
        got = nms_packed(boxes, scores, 0.001, 0.7, 300, multi_label)
        ref = nms_packed_reference(boxes, scores, 0.001, 0.7, 300, multi_label)
        assert torch.equal(got, ref)
        cpu = nms_packed(boxes.cpu(), scores.cpu(), 0.001, 0.7, 300, multi_label)
        assert abs(len(cpu) - len(got)) <= 0.01 * len(got)


@pytest.mark.parametrize("nc,batch", [(3, 32), (80, 64)])
def test_postprocess_time_per_batch(nc, batch):
    boxes, scores = _untrained_outputs(batch, 640, nc)
    # an untrained 80-class head's prior keeps every score under 0.001: a conf of 0 gives NMS the whole batch
    conf = 0.001 if nc == 3 else 0.0
    for _ in range(2):
        nms_packed(boxes, scores, conf, 0.7, 300, True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(5):
        out = nms_packed(boxes, scores, conf, 0.7, 300, True)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t) / 5 * 1000
    print(f"\nnms_packed: {nc} classes, batch {batch}, 640 px, untrained: {ms:.1f} ms per batch, {len(out)} detections")
    assert len(out) == 300 * batch


def test_validation_on_cuda_gives_the_cpu_metrics(tmp_path):
    """The whole validator (loader, AMP forward, loss, NMS, mapping, one copy, COCO in the background) on CUDA and
    on the CPU: the same images, and metrics within float noise of each other."""
    from libreyolo import LibreYOLO
    from libreyolo.config import TrainConfig
    from libreyolo.data.config import list_images, load_data_config
    from libreyolo.data.dataset import YOLODataset
    from libreyolo.data.labels import scan_labels
    from libreyolo.data.loader import ValLoader
    from libreyolo.data.shapes import make_shapes
    from libreyolo.eval.validator import start_validation

    dc = load_data_config(str(make_shapes(tmp_path / "shapes", n_train=2, n_val=40, size=320)))
    ds = YOLODataset(scan_labels(list_images(dc.val), dc.nc), 320, augment=False)
    model = LibreYOLO("LibreYOLO9t")
    net = model.prepare_for_training(dc.names, fresh=True)
    out = {}
    for dev in (torch.device("cpu"), DEV):
        net = net.to(dev)
        loader = ValLoader(ds, 16, 2, dev.type == "cuda", persistent=True)
        loader.prefetch()
        pending = start_validation(
            net,
            model.family,
            loader,
            dev,
            dc.names,
            model.family.loss(net, TrainConfig.from_overrides({"imgsz": 320})),
            static_shape=dev.type == "cuda",
        )
        out[dev.type] = pending.result()
        loader.close()
    assert out["cpu"]["images"] == out["cuda"]["images"] == 40
    for k in ("map", "map50"):
        assert out["cuda"][k] == pytest.approx(out["cpu"][k], abs=0.02)


@pytest.mark.parametrize("captured_on_zeros", [False, True])
def test_graphed_validation_matches_eager_and_follows_weights_changed_in_place(tmp_path, captured_on_zeros):
    """eval/graphed.py: forward and loss replayed from one graph give the eager validation's detections and losses,
    also after the weights change in place (as the EMA copy's do between epochs); the short last batch is padded.
    captured_on_zeros: the graph was captured first on a batch of zeros without labels, as a training run's
    validation warm-up does (engine/epochval.py)."""
    from libreyolo import LibreYOLO
    from libreyolo.config import TrainConfig
    from libreyolo.data.config import list_images, load_data_config
    from libreyolo.data.dataset import YOLODataset, capacity
    from libreyolo.data.labels import scan_labels
    from libreyolo.data.loader import ValLoader
    from libreyolo.data.shapes import make_shapes
    from libreyolo.eval.graphed import EvalGraph
    from libreyolo.eval.validator import start_validation

    dc = load_data_config(str(make_shapes(tmp_path / "shapes", n_train=2, n_val=40, size=320)))
    ls = scan_labels(list_images(dc.val), dc.nc)
    loader = ValLoader(YOLODataset(ls, 320, augment=False), 16, 2, True, persistent=True)  # 16 + 16 + 8 images
    model = LibreYOLO("LibreYOLO9t")
    net = model.prepare_for_training(dc.names, fresh=True).to(DEV).eval()
    loss = model.family.loss(net, TrainConfig.from_overrides({"imgsz": 320}))
    graph = EvalGraph(net, loss, torch.float16, capacity(max(map(len, ls.labels))))
    if captured_on_zeros:
        from libreyolo.eval.validator import to_input

        x = to_input(torch.zeros((16, 320, 320, 3), dtype=torch.uint8), DEV)
        graph(x, torch.zeros((16, 1, 5), device=DEV), torch.zeros((16, 1), dtype=torch.bool, device=DEV), (320, 320))
        assert graph.graph is not None and graph.replays == 1
    for round_ in range(2):
        eager = start_validation(
            net, model.family, loader, DEV, dc.names, loss, autocast_dtype=torch.float16, static_shape=True
        ).result()
        graphed = start_validation(
            net, model.family, loader, DEV, dc.names, loss, autocast_dtype=torch.float16, static_shape=True, graph=graph
        ).result()
        # 16 + 16 + 8 (padded to 16) images a round, all replayed from the one graph
        assert graph.error is None and graph.replays == 3 * (round_ + 1) + captured_on_zeros
        assert graphed["detections"] == eager["detections"] and graphed["map"] == pytest.approx(eager["map"], abs=1e-6)
        for k, v in eager["losses"].items():
            assert graphed["losses"][k] == pytest.approx(v, rel=1e-4), k
        with torch.no_grad():  # what an EMA update does between epochs: the same tensors, new values
            for p in net.parameters():
                p.mul_(0.9)
    loader.close()


def test_validation_inside_training_runs_on_its_thread_from_the_weights_its_epoch_ended_with(tmp_path, monkeypatch):
    """engine/epochval.py on a GPU: each epoch's validation runs on the validation thread (its own stream) while the
    next epoch trains, and what it reads is exactly the EMA weights the epoch ended with (epochN.pt, saved right
    after it started), not weights the next epoch's steps have already updated in place."""
    import threading

    from libreyolo import LibreYOLO, tasks
    from libreyolo.data.shapes import make_shapes
    from libreyolo.engine.checkpoint import load_checkpoint
    from libreyolo.events import read_events

    read: list[tuple[str, dict[str, torch.Tensor]]] = []
    impl = tasks.get_task("detect").implementation()
    real = impl.start_validation

    def start(net, *args, **kwargs):
        # cloned on the validation thread's stream, after it waited for the weights copy
        read.append((threading.current_thread().name, {k: v.detach().clone() for k, v in net.state_dict().items()}))
        return real(net, *args, **kwargs)

    # TaskImpl is frozen: the run reads the task's implementation from the registry's cache, so the cache holds a copy
    monkeypatch.setitem(tasks._IMPLS, "detect", dataclasses.replace(impl, start_validation=start))
    data = make_shapes(tmp_path / "d", 64, 16, 160)
    m = LibreYOLO("LibreYOLO9t")
    m.train(data=str(data), epochs=3, imgsz=160, batch=8, device=0, workers=2, save_period=1, project=str(tmp_path))
    ev = list(read_events(m.last_run / "events.jsonl"))
    assert ev[-1]["status"] == "finished"
    assert [e["epoch"] for e in ev if e["type"] == "val"] == [0, 1, 2]
    assert [name for name, _ in read] == ["libreyolo-val"] * 3
    for epoch, (_, weights) in enumerate(read):
        saved = load_checkpoint(m.last_run / "weights" / f"epoch{epoch + 1}.pt")["model"]
        for k, v in weights.items():
            torch.testing.assert_close(saved[k], v.cpu(), rtol=0, atol=0, msg=k)
    assert any(not torch.equal(read[1][1][k], read[2][1][k]) for k in read[1][1])  # the weights did move


def test_the_validation_graph_is_captured_beside_the_first_epoch(tmp_path, monkeypatch):
    """engine/epochval.py: a few steps into a run the validation's graph is captured on a thread of its own, beside
    the training steps; the validations after it only replay it."""
    import threading

    from libreyolo import LibreYOLO
    from libreyolo.data.shapes import make_shapes
    from libreyolo.eval import graphed
    from libreyolo.events import read_events

    captured_by: list[str] = []
    eager_by: set[str] = set()  # threads that ran the network outside the graph (the capture's own passes)
    real_capture, real_body = graphed.EvalGraph._capture, graphed.EvalGraph._body

    def capture(self, *args, **kwargs):
        captured_by.append(threading.current_thread().name)
        return real_capture(self, *args, **kwargs)

    def body(self, *args, **kwargs):
        eager_by.add(threading.current_thread().name)
        return real_body(self, *args, **kwargs)

    monkeypatch.setattr(graphed.EvalGraph, "_capture", capture)
    monkeypatch.setattr(graphed.EvalGraph, "_body", body)
    data = make_shapes(tmp_path / "d", 64, 16, 160)  # 8 steps an epoch: the warm-up starts after the 5th
    m = LibreYOLO("LibreYOLO9t")
    m.train(data=str(data), epochs=2, imgsz=160, batch=8, device=0, workers=2, project=str(tmp_path))
    ev = list(read_events(m.last_run / "events.jsonl"))
    assert ev[-1]["status"] == "finished"
    assert [e["epoch"] for e in ev if e["type"] == "val"] == [0, 1]
    assert not [e for e in ev if e["type"] == "warning" and e.get("code") == "val_graph"]
    assert captured_by == ["libreyolo-val-warm"]
    assert eager_by == {"libreyolo-val-warm"}  # the validations replayed it for every batch
