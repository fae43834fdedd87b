"""The validator: batched NMS and device-side box mapping give the mAP of the per-image path; the COCO
evaluation runs in the background; static shapes; the validation loader's prefetch and persistent workers."""

import types

import numpy as np
import pytest
import torch

from libreyolo.data.config import list_images, load_data_config
from libreyolo.data.dataset import YOLODataset
from libreyolo.data.labels import scan_labels
from libreyolo.data.loader import ValLoader, default_val_workers
from libreyolo.eval.coco import CocoAccumulator
from libreyolo.eval.validator import PendingValidation, start_validation, validate
from libreyolo.nn import nms as N

IMGSZ = 64


def _dataset(tiny_data, n=None):
    dc = load_data_config(str(tiny_data / "data.yaml") if tiny_data.is_dir() else str(tiny_data))
    images = list_images(dc.val)[:n]
    return YOLODataset(scan_labels(images, dc.nc), IMGSZ, augment=False), dc.names


class _ReplayNet(torch.nn.Module):
    """Stands in for a detector: returns, batch after batch, predictions made from the ground truth (jittered,
    duplicated, some with the wrong class) plus clutter, so that NMS has work and mAP is far from 0 and 1."""

    def __init__(self, ds: YOLODataset, batch: int, nc: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        preds = []
        for i in range(len(ds)):
            item = ds[i]
            gt = torch.as_tensor(item["boxes"]).reshape(-1, 5)
            A = 120
            boxes = torch.rand(A, 2, generator=g) * IMGSZ
            boxes = torch.cat((boxes, boxes + torch.rand(A, 2, generator=g) * 20 + 2), 1)
            scores = torch.rand(A, nc, generator=g) ** 4 * 0.5
            for k, (c, *xyxy) in enumerate(gt.tolist()):
                for d in range(3):  # three near copies of each object
                    j = 3 * k + d
                    boxes[j] = torch.tensor(xyxy) + torch.randn(4, generator=g) * (1 + d)
                    scores[j] = 0.01
                    scores[j, int(c) if torch.rand(1, generator=g) < 0.8 else (int(c) + 1) % nc] = (
                        0.5 + 0.5 * torch.rand(1, generator=g).item()
                    )
            preds.append(torch.cat((boxes, scores), 1))
        self.batches = list(torch.stack(preds).split(batch))
        self.calls = 0

    def forward(self, x):
        p = self.batches[self.calls % len(self.batches)]
        self.calls += 1
        if x.shape[0] > p.shape[0]:  # static_shape padding: the extra rows must be dropped again
            p = torch.cat((p, torch.full((x.shape[0] - p.shape[0], *p.shape[1:]), 0.9)))
        return p


def _family(nms_fn):
    def postprocess(net, raw, imgsz, conf=0.25, iou=0.7, max_det=300, multi_label=False):
        return nms_fn(raw[..., :4], raw[..., 4:], conf, iou, max_det, multi_label)

    return types.SimpleNamespace(postprocess=postprocess, loss_terms=("box", "cls"))


def _per_image_reference(ds, names, net, batch):
    """The validator as it was: reference NMS per image, boxes mapped back on the host, ground truth per image."""
    acc = CocoAccumulator(names)
    net.calls = 0
    loader = ValLoader(ds, batch, 0, False)
    for b in loader:
        out = N.nms_packed_reference(*net(b["img"]).split((4, len(names)), 2), 0.001, 0.7, 300, True)
        for k, d in enumerate(N.split_detections(out, b["img"].shape[0])):
            i = int(b["index"][k])
            s, (px, py) = float(b["scale"][k]), b["pad"][k].tolist()
            h0, w0 = ds.labels.shapes[i]
            boxes = (d["boxes"].numpy() - (px, py, px, py)) / s
            boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, w0)
            boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, h0)
            lab = ds.labels.labels[i]
            xyxy = np.concatenate([lab[:, 1:3] - lab[:, 3:5] / 2, lab[:, 1:3] + lab[:, 3:5] / 2], 1) * (w0, h0, w0, h0)
            acc.add(
                i, (h0, w0), np.concatenate([lab[:, :1], xyxy], 1), boxes, d["scores"].numpy(), d["classes"].numpy()
            )
    return acc.evaluate()


@pytest.mark.parametrize("static_shape", [False, True])
def test_batched_validation_gives_the_per_image_mAP(tiny_data, static_shape):
    ds, names = _dataset(tiny_data)
    net = _ReplayNet(ds, 3, len(names))
    ref = _per_image_reference(ds, names, net, 3)
    assert 0.1 < ref["map50"] < 0.99
    for nms_fn in (N.nms_packed, N.nms_packed_reference):
        net.calls = 0
        got = validate(
            net, _family(nms_fn), ValLoader(ds, 3, 0, False), torch.device("cpu"), names, static_shape=static_shape
        )
        for k in ("map", "map50", "precision", "recall"):
            assert got[k] == pytest.approx(ref[k], abs=1e-6), k
        assert got["images"] == len(ds) and got["detections"] > 0 and got["bad"] == []


def test_start_validation_returns_at_once_and_the_result_waits(tiny_data, monkeypatch):
    import threading

    from libreyolo.eval import coco

    ds, names = _dataset(tiny_data)
    net = _ReplayNet(ds, 4, len(names))
    gate = threading.Event()
    real = coco.CocoAccumulator.evaluate

    def evaluate(self, workers=1, process=None):
        gate.wait(30)
        return real(self, workers, process)

    monkeypatch.setattr(coco.CocoAccumulator, "evaluate", evaluate)
    pending = start_validation(net, _family(N.nms_packed), ValLoader(ds, 4, 0, False), torch.device("cpu"), names)
    assert isinstance(pending, PendingValidation) and not pending.done()
    with pytest.raises(TimeoutError):
        pending.result(timeout=0.01)
    gate.set()
    out = pending.result()
    assert pending.done()
    assert set(out) >= {
        "precision",
        "recall",
        "map50",
        "map",
        "losses",
        "images",
        "time_s",
        "eval_s",
        "bad",
        "detections",
    }
    assert out["losses"] == {"box": 0.0, "cls": 0.0} and out["eval_s"] > 0 and out["time_s"] > 0


def test_a_failed_evaluation_raises_from_result(tiny_data, monkeypatch):
    from libreyolo.eval import coco

    ds, names = _dataset(tiny_data)

    def boom(self, workers=1, process=None):
        raise RuntimeError("evaluation failed")

    monkeypatch.setattr(coco.CocoAccumulator, "evaluate", boom)
    pending = start_validation(
        _ReplayNet(ds, 4, len(names)), _family(N.nms_packed), ValLoader(ds, 4, 0, False), torch.device("cpu"), names
    )
    with pytest.raises(RuntimeError, match="evaluation failed"):
        pending.result()


def test_threaded_validation_runs_both_parts_on_its_thread_and_waits_apart_for_the_device_part(tiny_data, monkeypatch):
    """eval/threaded.py (stream-less, as a CPU run would make it): the device part and the COCO evaluation run on the
    validation thread; wait_device() returns before the evaluation finishes, result() waits for it and gives the
    same metrics as a validation in the caller's thread; an error in either part is raised by result()."""
    import threading

    from libreyolo.eval import coco
    from libreyolo.eval.threaded import ThreadedValidation

    ds, names = _dataset(tiny_data)
    net = _ReplayNet(ds, 4, len(names))
    direct = start_validation(net, _family(N.nms_packed), ValLoader(ds, 4, 0, False), torch.device("cpu"), names)
    expected = direct.result()
    threads: dict[str, str] = {}
    gate = threading.Event()
    real_eval = coco.CocoAccumulator.evaluate

    def evaluate(self, workers=1, process=None):
        threads["eval"] = threading.current_thread().name
        gate.wait(30)
        return real_eval(self, workers, process)

    def run():
        threads["device"] = threading.current_thread().name
        return start_validation(
            net, _family(N.nms_packed), ValLoader(ds, 4, 0, False), torch.device("cpu"), names, background=False
        )

    monkeypatch.setattr(coco.CocoAccumulator, "evaluate", evaluate)
    v = ThreadedValidation(run)
    v.wait_device()
    assert not v.done()  # the evaluation waits at the gate
    gate.set()
    out = v.result()
    assert v.done() and threads == {"device": "libreyolo-val", "eval": "libreyolo-val"}
    for k in ("map", "map50", "precision", "recall", "images", "detections"):
        assert out[k] == expected[k], k

    def fail():
        raise RuntimeError("forward failed")

    failed = ThreadedValidation(fail)
    failed.wait_device()
    with pytest.raises(RuntimeError, match="forward failed"):
        failed.result()


def test_real_network_with_loss_and_persistent_prefetched_workers(tiny_data):
    from libreyolo import LibreYOLO
    from libreyolo.config import TrainConfig

    ds, names = _dataset(tiny_data)
    model = LibreYOLO("LibreYOLO9t")
    net = model.prepare_for_training(names, fresh=True)
    loss = model.family.loss(net, TrainConfig.from_overrides({"imgsz": IMGSZ}))
    loader = ValLoader(ds, 3, 1, False, persistent=True)
    try:
        loader.prefetch()
        first = validate(net, model.family, loader, torch.device("cpu"), names, loss)
        pid = loader._iterator._workers[0].pid
        loader.prefetch()
        loader.prefetch()  # twice: still one pass
        second = validate(net, model.family, loader, torch.device("cpu"), names, loss)
        assert loader._iterator._workers[0].pid == pid  # the same worker process served both validations
    finally:
        loader.close()
    assert loader._iterator is None
    assert first["images"] == second["images"] == len(ds)
    assert set(first["losses"]) == set(model.family.loss_terms)
    for k in ("map", "map50", "precision", "recall"):
        assert first[k] == second[k]


def test_val_loader_prefetch_yields_each_batch_once_in_order(tiny_data):
    ds, _ = _dataset(tiny_data)
    for workers, persistent in ((0, False), (1, False), (1, True)):
        loader = ValLoader(ds, 3, workers, False, persistent=persistent)
        for _ in range(2):
            loader.prefetch()
            idx = [i for b in loader for i in b["index"].tolist()]
            assert idx == list(range(len(ds)))
        loader.close()
    assert default_val_workers(15) == 7 and default_val_workers(1) == 1 and default_val_workers(0) == 0


def test_parallel_coco_evaluation_by_categories_is_exact(monkeypatch):
    from libreyolo.eval import coco

    rng = np.random.default_rng(0)
    nc, n_img = 6, 40
    rows, sizes, dets, ids = [], np.full((n_img, 2), 480.0), [], np.arange(n_img)
    for i in range(n_img):
        n = int(rng.integers(0, 5))
        xy = rng.uniform(0, 400, (n, 2))
        g = np.column_stack([np.full(n, i), rng.integers(0, nc, n), xy, xy + rng.uniform(10, 80, (n, 2))])
        rows.append(g)
        m = 60
        xy = rng.uniform(0, 420, (m, 2))
        boxes = np.column_stack([xy, xy + rng.uniform(5, 60, (m, 2))])
        boxes[:n] = g[:, 2:] + rng.normal(0, 3, (n, 4))
        cls = rng.integers(0, nc, m)
        cls[:n] = g[:, 1]
        scores = rng.uniform(0.001, 0.4, m)
        scores[:n] = rng.uniform(0.5, 1.0, n)
        dets.append(np.column_stack([np.full(m, i % 8), boxes, scores, cls]))
    gt = (np.concatenate(rows), sizes)
    accs = [CocoAccumulator([str(c) for c in range(nc)], gt) for _ in range(2)]
    for acc in accs:
        for b in range(n_img // 8):
            acc.add_batch(ids[8 * b : 8 * b + 8], np.concatenate(dets[8 * b : 8 * b + 8]))
    monkeypatch.setattr(coco, "PARALLEL_MIN_DETECTIONS", 0)
    one, two = accs[0].evaluate(1), accs[1].evaluate(3)
    assert one["map50"] > 0.1
    assert {k: v for k, v in one.items() if k not in ("curves", "boxes")} == {
        k: v for k, v in two.items() if k not in ("curves", "boxes")
    }
    for k in ("precision", "p", "r", "f1"):  # the curves too, the per-detection matches put back in order
        np.testing.assert_array_equal(one["curves"][k], two["curves"][k])


def test_release_workers_stops_a_prefetched_persistent_val_loader(tiny_data):
    """The trainer's release_workers (data/loader.py) also stops a primed persistent ValLoader: the started pass
    lives only in DataLoader's own iterator slot."""
    from libreyolo.data.loader import release_workers

    ds, _ = _dataset(tiny_data)
    loader = ValLoader(ds, 3, 1, False, persistent=True)
    loader.prefetch()
    proc = loader._iterator._workers[0]
    assert proc.is_alive()
    release_workers(loader)
    proc.join(10)
    assert not proc.is_alive()
    assert [i for b in loader for i in b["index"].tolist()] == list(range(len(ds)))  # a new pass still works
    loader.close()


def test_validation_workers_get_a_head_start_in_time_as_well_as_in_steps():
    from libreyolo.engine.epochval import val_prefetch_due

    assert val_prefetch_due(4, None) and not val_prefetch_due(5, None)  # step time unknown: four steps ahead
    assert val_prefetch_due(19, 0.026) and not val_prefetch_due(20, 0.026)  # 26 ms steps: ~0.5 s ahead
    assert val_prefetch_due(4, 0.2) and not val_prefetch_due(5, 0.2)  # slow steps: four are head start enough


def test_the_validation_warm_up_starts_once_after_its_steps_and_a_validation_waits_for_it():
    """engine/epochval.py: after_step counts down to the warm-up (the validation graph's capture, on a GPU), starts
    it once on its own thread; the validation workers' prefetch does not wait for it (it never reads the loader),
    whatever next uses the validation's graph or device joins it first."""
    import threading
    import time
    from types import SimpleNamespace

    from libreyolo.engine.epochval import EpochValidations

    vals = object.__new__(EpochValidations)  # only the warm-up's countdown and thread
    vals._warm_in, vals._warm, vals.pending = 3, None, None
    ran: list[str] = []
    prefetched_after: list[int] = []  # how many warm-ups had ended when the prefetch ran
    loader = SimpleNamespace(prefetch=lambda: prefetched_after.append(len(ran)))
    vals.s, vals.cfg = SimpleNamespace(is_main=True, val_loader=loader), SimpleNamespace(val=True)

    def warm_up():
        time.sleep(0.3)
        ran.append(threading.current_thread().name)

    vals._warm_up = warm_up
    vals.after_step()
    vals.after_step()
    assert vals._warm is None
    vals.after_step()
    assert vals._warm is not None and not ran  # running beside the caller
    vals.after_step()
    vals.prefetch(0)
    assert prefetched_after == [0]
    vals.wait_device()  # a validation's start, invalidate(), the end of the run
    assert ran == ["libreyolo-val-warm"] and vals._warm is None


@pytest.mark.parametrize("workers,persistent", [(0, False), (1, True)])
def test_validation_passes_leave_the_global_random_stream_alone(tiny_data, workers, persistent):
    # the setup starts the validation workers early: their start must not shift the training's seeds (the train
    # loader's workers take theirs from torch's global generator, drawn when its pass opens)
    ds, _ = _dataset(tiny_data)
    loader = ValLoader(ds, 3, workers, False, persistent=persistent)
    try:
        before = torch.random.get_rng_state()
        loader.prefetch()
        for _ in range(2):
            assert sum(len(b["img"]) for b in loader) == len(ds)
        assert torch.equal(torch.random.get_rng_state(), before)
    finally:
        loader.close()


def test_setup_starts_validation_workers_early_only_where_a_gpu_run_validates_first(tiny_data):
    from libreyolo.engine.builders import start_val_workers

    ds, _ = _dataset(tiny_data)
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    cases = [  # (device, main rank, first epoch validates, persistent) -> primed
        ((cuda, True, True, True), True),
        ((cpu, True, True, True), False),
        ((cuda, False, True, True), False),
        ((cuda, True, False, True), False),
        ((cuda, True, True, False), False),
    ]
    for (device, main, due, persistent), primed in cases:
        loader = ValLoader(ds, 3, 1, False, persistent=persistent)
        try:
            start_val_workers(loader, device, main, due)
            assert (loader._primed or loader._ahead is not None) == primed, (device, main, due, persistent)
        finally:
            loader.close()
