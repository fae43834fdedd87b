"""Per-class metrics, the curve data and the confusion matrix on a tiny set whose right answers are known by hand:
class a predicted in the right place but 2 px off (IoU 0.818: a hit at IoU 0.50-0.80, a miss above), class b
predicted exactly, class c's objects all predicted as b (a fixed swap), one false a and one missed c."""

from __future__ import annotations

import numpy as np
import pytest

from libreyolo.eval.coco import CocoAccumulator
from libreyolo.eval.confusion import confusion_matrix

NAMES = ["a", "b", "c"]
A, B, C = (10, 10, 30, 30), (50, 10, 70, 30), (10, 50, 40, 80)


def tiny_set() -> CocoAccumulator:
    acc = CocoAccumulator(NAMES)
    for i in range(4):
        gt = [(0, *A), (1, *B), (2, *C)]
        if i == 3:
            gt.append((2, 60, 60, 90, 90))  # a c that nothing predicts
        # b: three found above the swapped c's (0.97 > 0.95), one below (0.80)
        dets = [(0, A[0] + 2, A[1], A[2] + 2, A[3], 0.9), (1, *B, 0.97 if i < 3 else 0.8), (1, *C, 0.95)]
        if i == 0:
            dets.append((0, 80, 80, 95, 95, 0.3))  # a false a, above the confusion matrix's 0.25
        if i == 1:
            dets.append((0, 80, 80, 95, 95, 0.1))  # a false a below it: in AP, not in the matrix
        d = np.array(dets, np.float64)
        acc.add(i, (100, 100), np.array(gt, np.float64), d[:, 1:5], d[:, 5], d[:, 0])
    return acc


@pytest.fixture(scope="module")
def result() -> dict:
    return tiny_set().evaluate()


def test_per_class_table_holds_the_known_answers(result: dict) -> None:
    rows = {r["class"]: r for r in result["per_class"]}
    assert [r["class"] for r in result["per_class"]] == NAMES  # the dataset's names order
    assert (rows["a"]["images"], rows["a"]["instances"]) == (4, 4)
    assert (rows["c"]["images"], rows["c"]["instances"]) == (4, 5)
    # a: every object found at IoU 0.5-0.80 (7 of 10 thresholds), none above; its false ones score lowest
    assert rows["a"]["map50"] == pytest.approx(1.0)
    assert rows["a"]["map"] == pytest.approx(0.7)
    assert (rows["a"]["precision"], rows["a"]["recall"]) == pytest.approx((1.0, 1.0))
    # b: 3 hits, then the 4 swapped c's, then its 4th hit: interpolated precision 1 up to recall 0.75, then 4/8;
    # COCO's 101 recall points: 76 at 1.0 and 25 at 0.5
    assert rows["b"]["map50"] == pytest.approx((76 + 25 * 0.5) / 101)
    assert rows["b"]["map"] == pytest.approx(rows["b"]["map50"])  # exact boxes: the same at every IoU
    assert (rows["b"]["precision"], rows["b"]["recall"]) == pytest.approx((1.0, 0.75))  # F1 0.857 beats 0.667
    assert (rows["c"]["precision"], rows["c"]["recall"], rows["c"]["map50"], rows["c"]["map"]) == (0, 0, 0, 0)
    # the run's numbers are the means of the rows
    assert result["map50"] == pytest.approx(np.mean([r["map50"] for r in rows.values()]))
    assert result["map"] == pytest.approx(np.mean([r["map"] for r in rows.values()]))
    assert result["precision"] == pytest.approx(np.mean([r["precision"] for r in rows.values()]))


def test_area_under_pr_curve_is_the_evaluators_ap50(result: dict) -> None:
    c = result["curves"]
    assert np.allclose(np.diff(c["recall"]), 0.01) and c["recall"][0] == 0 and c["recall"][-1] == 1
    for k, row in enumerate(result["per_class"]):
        # COCO integrates its curve over 101 equally spaced recall points (each weighs 1/101); the trapezoid rule
        # over the same points differs from that by at most |p(0) + p(1) - 2 AP| / 200
        curve = c["precision"][:, k]
        assert curve.mean() == pytest.approx(row["map50"], abs=1e-3), row["class"]
        bound = abs(curve[0] + curve[-1] - 2 * row["map50"]) / 200 + 1e-9
        assert abs(np.trapezoid(curve, c["recall"]) - row["map50"]) <= bound, row["class"]
    # b's curve: 1.0 up to recall 0.75, 0.5 beyond (see test_per_class_table_holds_the_known_answers)
    assert np.allclose(c["precision"][:76, 1], 1.0) and np.allclose(c["precision"][76:, 1], 0.5)


def test_confidence_curves_count_the_kept_detections(result: dict) -> None:
    c = result["curves"]
    at = {round(float(x), 2): j for j, x in enumerate(c["conf"])}
    # b at 0.96: its 3 hits at 0.97 only; at 0.9: the 4 swapped c's (0.95) too; at 0.5: all 8
    assert (c["p"][at[0.96], 1], c["r"][at[0.96], 1]) == pytest.approx((1.0, 0.75))
    assert (c["p"][at[0.9], 1], c["r"][at[0.9], 1]) == pytest.approx((3 / 7, 0.75))
    assert (c["p"][at[0.5], 1], c["r"][at[0.5], 1]) == pytest.approx((0.5, 1.0))
    # a at 0.2: 4 hits and the 0.3 false one; at 0.05 the 0.1 one too
    assert (c["p"][at[0.2], 0], c["r"][at[0.2], 0]) == pytest.approx((0.8, 1.0))
    assert c["p"][at[0.05], 0] == pytest.approx(4 / 6)
    assert c["r"][:, 2].max() == 0.0  # c: never found
    f1 = 2 * c["p"] * c["r"] / np.maximum(c["p"] + c["r"], 1e-16)
    assert np.allclose(c["f1"], f1)


def test_confusion_matrix_holds_the_known_counts(result: dict) -> None:
    b = result["boxes"]
    cm = confusion_matrix(b["images"], b["gt"], b["dt"], len(NAMES))
    expected = np.array(
        [
            # predicted a, b, c, background
            [4, 0, 0, 0],  # true a
            [0, 4, 0, 0],  # true b
            [0, 4, 0, 1],  # true c: all 4 taken for b, the 5th missed
            [1, 0, 0, 0],  # background: the false a above 0.25
        ]
    )
    np.testing.assert_array_equal(cm, expected)


def test_empty_evaluation_still_counts_instances() -> None:
    acc = CocoAccumulator(NAMES)
    acc.add(0, (100, 100), np.array([(1, *B)], np.float64), np.zeros((0, 4)), np.zeros(0), np.zeros(0))
    out = acc.evaluate()
    rows = {r["class"]: r for r in out["per_class"]}
    assert rows["b"]["instances"] == 1 and rows["b"]["images"] == 1 and rows["a"]["instances"] == 0
    assert rows["a"]["map50"] is None  # no ground truth: undefined, not 0
    b = out["boxes"]
    cm = confusion_matrix(b["images"], b["gt"], b["dt"], len(NAMES))
    assert cm[1, 3] == 1 and cm.sum() == 1
