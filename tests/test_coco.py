"""The COCO accumulator against faster-coco-eval's own documented path (COCO + loadRes of result dicts)."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from faster_coco_eval import COCO, COCOeval_faster

from libreyolo import forked
from libreyolo.eval import coco
from libreyolo.eval.coco import CocoAccumulator, EvalProcess


def _reference(names, images, gts, dets):
    quiet = lambda *a, **k: None  # noqa: E731
    gt = COCO(
        {"images": images, "annotations": gts, "categories": [{"id": i, "name": n} for i, n in enumerate(names)]},
        print_function=quiet,
    )
    ev = COCOeval_faster(gt, gt.loadRes(dets), "bbox", print_function=quiet)
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    return ev.stats[0], ev.stats[1]


def _noisy(rng):
    """-> an accumulator of 30 images with jittered and wrong detections, and the same as faster-coco-eval inputs."""
    names = ["a", "b", "c"]
    acc = CocoAccumulator(names)
    images, gts, dets = [], [], []
    for i in range(30):
        n = int(rng.integers(0, 6))  # some images without objects
        xy = rng.uniform(0, 500, (n, 2))
        gt = np.column_stack([rng.integers(0, 3, n), xy, xy + rng.uniform(10, 120, (n, 2))])
        # detections: jittered ground truth (some with the wrong class) plus clutter
        jit = gt[:, 1:] + rng.normal(0, 6, (n, 4))
        clutter = np.sort(rng.uniform(0, 600, (int(rng.integers(0, 40)), 4)).reshape(-1, 2, 2), 1).reshape(-1, 4)
        boxes = np.concatenate([jit, clutter])
        classes = np.concatenate(
            [np.where(rng.random(n) < 0.85, gt[:, 0], (gt[:, 0] + 1) % 3), rng.integers(0, 3, len(clutter))]
        ).astype(int)
        scores = np.concatenate([rng.uniform(0.3, 1.0, n), rng.uniform(0.001, 0.6, len(clutter))])
        acc.add(i, (640, 640), gt, boxes, scores, classes)
        images.append({"id": i, "height": 640, "width": 640})
        for c, x1, y1, x2, y2 in gt.tolist():
            gts.append(
                {
                    "id": len(gts) + 1,
                    "image_id": i,
                    "category_id": int(c),
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": (x2 - x1) * (y2 - y1),
                    "iscrowd": 0,
                }
            )
        for (x1, y1, x2, y2), s, c in zip(boxes.tolist(), scores.tolist(), classes.tolist()):
            dets.append({"image_id": i, "category_id": int(c), "bbox": [x1, y1, x2 - x1, y2 - y1], "score": s})
    return acc, names, images, gts, dets


def test_map_matches_faster_coco_eval_loadres_on_noisy_detections():
    acc, names, images, gts, dets = _noisy(np.random.default_rng(1))
    got = acc.evaluate()
    ref_map, ref_map50 = _reference(names, images, gts, dets)
    assert 0.2 < got["map50"] < 1.0  # a non-trivial case: partly right, partly wrong
    assert got["map"] == ref_map and got["map50"] == ref_map50
    assert 0 < got["precision"] <= 1 and 0 < got["recall"] <= 1


def test_nothing_to_evaluate_gives_zeros():
    acc = CocoAccumulator(["a"])
    acc.add(0, (64, 64), np.zeros((0, 5)), np.zeros((3, 4)), np.ones(3), np.zeros(3, int))
    out = acc.evaluate()
    assert {k: out[k] for k in ("map50", "map", "precision", "recall")} == dict.fromkeys(
        ("map50", "map", "precision", "recall"), 0.0
    )
    assert out["curves"] is None and out["per_class"][0]["instances"] == 0
    acc.add(1, (64, 64), np.array([[0, 1, 1, 20, 20]]), np.zeros((0, 4)), np.zeros(0), np.zeros(0, int))
    assert acc.evaluate()["map"] == 0.0


_EVALUATE = coco._evaluate


def _evaluate_noting_pid(*args):
    """coco._evaluate, appending the pid of the process it ran in to the file $PID_LOG."""
    with open(os.environ["PID_LOG"], "a") as f:
        f.write(f"{os.getpid()}\n")
    return _EVALUATE(*args)


def _scalars(out: dict) -> dict:
    """The metrics and the per-class table (the curves and boxes are arrays)."""
    return {k: v for k, v in out.items() if k not in ("curves", "boxes")}


def test_evaluation_in_the_kept_child_process_gives_the_same_metrics(monkeypatch, tmp_path):
    log = tmp_path / "pids"
    monkeypatch.setenv("PID_LOG", str(log))
    monkeypatch.setattr(coco, "_evaluate", _evaluate_noting_pid)
    process = EvalProcess()
    process.start()
    (started,) = process._pool._processes  # forked by start(), the one child that evaluates below
    try:
        for seed in (1, 2):
            acc = _noisy(np.random.default_rng(seed))[0]
            assert _scalars(acc.evaluate(process=process)) == _scalars(acc.evaluate())
    finally:
        process.close()
    pids = log.read_text().split()
    here = str(os.getpid())
    # alternately in one kept child and here
    assert pids[1] == pids[3] == here and pids[0] == pids[2] == str(started) != here, pids
    assert process._pool is None


def test_a_dead_evaluation_process_falls_back_to_this_one():
    process = EvalProcess()
    acc = _noisy(np.random.default_rng(3))[0]
    try:
        want = _scalars(acc.evaluate(process=process))
        (child,) = process._pool._processes.values()
        child.kill()
        child.join()
        assert _scalars(acc.evaluate(process=process)) == want  # the broken pool is noticed, the evaluation runs here
        assert process._pool is None and process._broken
    finally:
        process.close()


def _gone(pid: int) -> bool:
    """No such process, or a zombie nobody has reaped yet (a container's first process may not reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(
    "make",
    [
        "p = coco.EvalProcess(); p.start(); pids = list(p._pool._processes)",  # the kept child
        "p = forked.forked_pool(2); [f.result() for f in [p.submit(int) for _ in range(4)]]; pids = list(p._processes)",
    ],
)
def test_evaluation_children_end_when_their_parent_dies_without_closing_them(make):
    # a parent killed or ended by os._exit never shuts its pool down: its children must not wait for work forever
    imports = "import os\nfrom libreyolo import forked\nfrom libreyolo.eval import coco\n"
    script = f"{imports}{make}\nprint(*pids, flush=True)\nos._exit(0)\n"
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as parent:
        assert parent.stdout is not None
        children = [int(pid) for pid in parent.stdout.readline().split()]
        assert parent.wait(timeout=60) == 0
    assert children
    deadline = time.monotonic() + 10 * forked.PARENT_CHECK_S + 5
    while not all(map(_gone, children)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(map(_gone, children)), f"evaluation children {children} outlived their parent"
