"""The YOLOv9 loss and its task-aligned assigner compute what they computed before their op count was reduced
(tests/yolo9_loss_reference.py, a frozen copy): assignments exactly, loss terms and gradients to float rounding."""

import pytest
import torch
import yolo9_loss_reference as ref

from libreyolo.families.yolo9.assigner import TaskAlignedAssigner
from libreyolo.families.yolo9.loss import DetectionLoss
from libreyolo.nn.boxes import ciou

NC = 5


def _case(seed, b=3, m=6, size=128, padded=True, heads=2):
    g = torch.Generator().manual_seed(seed)
    A = sum((size // s) ** 2 for s in (8, 16, 32))
    raw = (torch.randn(heads * b, 64 + NC, A, generator=g) * 2).requires_grad_(True)
    xy = torch.rand(b, m, 2, generator=g) * size * 0.7
    wh = torch.rand(b, m, 2, generator=g) * size * 0.5 + 1
    targets = torch.cat((torch.randint(0, NC, (b, m, 1), generator=g).float(), xy, (xy + wh).clamp(max=size)), -1)
    mask = torch.rand(b, m, generator=g) < 0.7 if padded else torch.ones(b, m, dtype=torch.bool)
    mask[0] = False  # an image without objects
    targets[1, 1, 1:] = targets[1, 0, 1:]  # two identical boxes: ties in the assignment
    return raw, targets, mask, size


def _boxes(g, *shape, scale=100.0):
    xy = torch.rand(*shape, 2, generator=g) * scale
    return torch.cat((xy, xy + torch.rand(*shape, 2, generator=g) * scale * 0.5 + 0.01), -1)


def test_ciou_is_bit_for_bit_the_reference_with_its_gradient():
    g = torch.Generator().manual_seed(0)
    gt, pred = _boxes(g, 4, 7), _boxes(g, 4, 300)
    pred[1, :7] = gt[1]  # exact overlaps: ties of minimum/maximum
    assert torch.equal(ciou(gt.unsqueeze(2), pred.unsqueeze(1)), ref.ciou(gt.unsqueeze(2), pred.unsqueeze(1)))
    a, b = pred.clone().requires_grad_(True), pred.clone().requires_grad_(True)
    t = _boxes(g, 4, 300)
    t[1, :7] = pred[1, :7]
    out, want = ciou(a, t), ref.ciou(b, t)
    assert torch.equal(out, want)
    (out * torch.linspace(0.5, 2, 300)).sum().backward()
    (want * torch.linspace(0.5, 2, 300)).sum().backward()
    assert torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("seed", range(4))
def test_assignment_is_exactly_the_reference(seed):
    raw, targets, mask, size = _case(seed)
    b = targets.shape[0]
    g = torch.Generator().manual_seed(100 + seed)
    A = raw.shape[-1]
    scores = torch.rand(b, A, NC, generator=g)
    anchors = torch.rand(A, 2, generator=g) * size
    pred = _boxes(g, b, A, scale=size)
    pred[1, :5] = targets[1, 0, 1:]  # predictions equal to a ground truth
    args = (scores, pred, anchors, targets[..., 0].long(), targets[..., 1:5], mask)
    got = TaskAlignedAssigner(NC)(*args)
    want = ref.assign(*args)
    for x, y in zip(got, want):
        assert torch.equal(x, y)
    assert want[2].any() and not want[2][0].any()


def test_assignment_of_many_crowded_objects_is_exactly_the_reference():
    """Dense scenes: 48 target slots, most of them real, small and overlapping boxes, a zero-width one and one equal to
    another, so that anchors are claimed by several ground truths (the in-place resolution of those claims)."""
    g = torch.Generator().manual_seed(7)
    b, m, size = 2, 48, 128
    A = sum((size // s) ** 2 for s in (8, 16, 32))
    xy = torch.rand(b, m, 2, generator=g) * size * 0.5 + size * 0.2
    gt = torch.cat((xy, xy + torch.rand(b, m, 2, generator=g) * 30 + 10), -1)
    gt[0, 3, 2] = gt[0, 3, 0]  # zero width: no anchor inside
    gt[1, 5] = gt[1, 4]  # the same box twice
    mask = torch.rand(b, m, generator=g) < 0.9
    args = (
        torch.rand(b, A, NC, generator=g),
        _boxes(g, b, A, scale=size),
        torch.rand(A, 2, generator=g) * size,
        torch.randint(0, NC, (b, m), generator=g),
        gt,
        mask,
    )
    got, want = TaskAlignedAssigner(NC)(*args), ref.assign(*args)
    for x, y in zip(got, want):
        assert torch.equal(x, y)
    anchors = args[2]
    inside = ((anchors > gt[..., None, :2]) & (anchors < gt[..., None, 2:])).all(-1) & mask[..., None]  # (b, m, A)
    assert (inside.sum(1) > 1).sum() > 20 and want[2].sum() > 40  # many contested anchors, many foreground ones


@pytest.mark.parametrize("seed,heads", [(0, 2), (1, 2), (2, 1), (3, 2)])
def test_loss_and_gradients_match_the_reference(seed, heads):
    raw, targets, mask, size = _case(seed, heads=heads)
    weights = (1.0, 0.25)[:heads]
    loss, items = DetectionLoss(NC)(raw, targets, mask, (size, size), 3.0, weights)
    (grad,) = torch.autograd.grad(loss, raw)
    want_loss, want_items = ref.detection_loss(raw, targets, mask, (size, size), 3.0, weights, nc=NC)
    (want_grad,) = torch.autograd.grad(want_loss, raw)
    torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=0)
    torch.testing.assert_close(items, want_items, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-9)
