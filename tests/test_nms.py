"""Batched NMS (`nms_packed`) against its per-image definition (`nms_packed_reference`): the same detections,
bit for bit and in the same order, on random and real-network outputs."""

import pytest
import torch

from libreyolo.nn import nms as N
from libreyolo.nn.nms import nms_packed, nms_packed_reference, split_detections


def _random_outputs(seed: int, B: int = 5, A: int = 600, C: int = 4, ties: bool = False):
    g = torch.Generator().manual_seed(seed)
    cxy = torch.rand(B, A, 2, generator=g) * 320
    wh = torch.rand(B, A, 2, generator=g) * 60 + 2
    boxes = torch.cat((cxy - wh / 2, cxy + wh / 2), 2)
    scores = torch.rand(B, A, C, generator=g) ** 3
    if ties:  # float16 scores (AMP) tie often: the order must still be the defined one
        scores = (scores * 64).round() / 64
    scores[1] = 0.0  # an image without a candidate
    scores[2, :50] = torch.rand(50, C, generator=g) * 0.5 + 0.5  # few candidates above a high conf
    scores[2, 50:] = 0.0
    return boxes, scores


def _same(boxes, scores, conf, iou, max_det, multi_label, max_nms=30000, per_call=None):
    got = nms_packed(boxes, scores, conf, iou, max_det, multi_label, max_nms, boxes_per_call=per_call)
    ref = nms_packed_reference(boxes, scores, conf, iou, max_det, multi_label, max_nms)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    assert torch.equal(got, ref)
    return got


@pytest.mark.parametrize("multi_label", [True, False])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("per_call", [None, 700, 100_000])  # one image per call (CPU), a few, the whole batch
def test_batched_equals_reference_on_random_outputs(multi_label, ties, per_call):
    boxes, scores = _random_outputs(0, ties=ties)
    for conf, iou, max_det, max_nms in ((0.001, 0.7, 300, 30000), (0.25, 0.5, 10, 30000), (0.001, 0.7, 50, 200)):
        out = _same(boxes, scores, conf, iou, max_det, multi_label, max_nms, per_call)
        per_image = torch.bincount(out[:, 0].long(), minlength=5)
        assert per_image[1] == 0 and per_image.max() <= max_det
        assert (out[:, 5] > conf).all()


def test_packed_layout_grouped_by_image_best_first():
    boxes, scores = _random_outputs(1)
    out = nms_packed(boxes, scores, 0.01, 0.6, 300, True)
    b = out[:, 0]
    assert (b[1:] >= b[:-1]).all()
    for d in split_detections(out, 5):
        assert (d["scores"][1:] <= d["scores"][:-1]).all()


def test_more_candidates_than_max_nms_and_max_det():
    boxes, scores = _random_outputs(2, B=3, A=2000, C=8)
    out = _same(boxes, scores, 0.0005, 0.7, 300, True, max_nms=3000)
    assert torch.bincount(out[:, 0].long()).max() == 300  # max_det binds


def test_later_rounds_when_the_first_prefix_is_short_of_max_det(monkeypatch):
    """Duplicates suppress each other: the first prefix keeps too few, and later rounds must give the
    reference's answer (also with images decided in different rounds)."""
    monkeypatch.setattr(N, "PREFIX_MIN", 16)
    boxes, scores = _random_outputs(3, B=4, A=400, C=2)
    boxes[0, :300] = torch.tensor([10.0, 10.0, 50.0, 50.0])  # image 0: 300 near-copies of one box first
    boxes[0, :300] += torch.rand(300, 4) * 0.5
    scores[0, :300] = 0.9 + torch.rand(300, 2) * 0.05
    for per_call in (None, 10_000):
        _same(boxes, scores, 0.001, 0.7, 20, True, per_call=per_call)
        _same(boxes, scores, 0.001, 0.7, 3, False, per_call=per_call)


def test_nothing_above_conf_and_empty_inputs():
    boxes, scores = _random_outputs(4)
    assert nms_packed(boxes, scores * 0, 0.001, 0.7, 300, True).shape == (0, 7)
    assert nms_packed(boxes[:0], scores[:0], 0.001, 0.7, 300, True).shape == (0, 7)
    assert nms_packed(boxes, scores, 0.001, 0.7, 0, True).shape == (0, 7)


def test_real_network_outputs():
    """A randomly initialised YOLOv9-t: boxes from the real decode, scores near the conf threshold."""
    from libreyolo.families.yolo9.network import YOLO9

    torch.manual_seed(0)
    net = YOLO9("t", 3).eval()
    x = torch.rand(3, 3, 160, 160)
    x[1] = 0.5  # a flat grey image
    with torch.no_grad():
        pred = net.head.decode(net(x).float(), net.feature_shapes(160, 160))
    boxes, scores = pred[..., :4], pred[..., 4:]
    assert (scores > 0.001).sum() > 300  # candidates to suppress
    for multi_label in (True, False):
        for max_det in (300, 20):
            _same(boxes, scores, 0.001, 0.7, max_det, multi_label)
            _same(boxes, scores, 0.001, 0.7, max_det, multi_label, per_call=100_000)


def test_nms_kernel_is_torchvisions_without_importing_the_package():
    """nn.nms loads torchvision's compiled NMS op directly: a validation does not import torchvision (whose import
    pulls in torch._dynamo and Triton, seconds of a run's start on the H200 machine). Run in a fresh interpreter."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from libreyolo.nn.nms import _nms, nms_packed\n"
        "b = torch.rand(2, 500, 4) * 60; b[..., 2:] += b[..., :2]\n"
        "out = nms_packed(b, torch.rand(2, 500, 3), 0.01, 0.5, 50, True)\n"
        "assert len(out) > 0 and 'torchvision' not in sys.modules, sorted(m for m in sys.modules if 'vision' in m)\n"
        "import torchvision.ops\n"
        "bx, s = b[0], torch.rand(500)\n"
        "assert torch.equal(_nms()(bx, s, 0.5), torchvision.ops.nms(bx, s, 0.5))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
