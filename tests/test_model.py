import pytest
import torch
from torchvision.ops import complete_box_iou_loss

from libreyolo import LibreYOLO
from libreyolo.engine.checkpoint import load_checkpoint
from libreyolo.errors import CheckpointError, ConfigError
from libreyolo.families.yolo9.assigner import TaskAlignedAssigner
from libreyolo.families.yolo9.loss import DetectionLoss
from libreyolo.families.yolo9.network import YOLO9, TrainNet
from libreyolo.nn.boxes import ciou


@pytest.mark.parametrize("size,published", [("t", 2.0e6), ("s", 7.1e6)])
def test_parameter_counts_match_published_yolov9(size, published):
    n = sum(p.numel() for p in YOLO9(size, 80).parameters())
    assert abs(n - published) / published < 0.10, n


def test_aux_head_exists_only_in_the_training_wrapper():
    net = YOLO9("t", 3)
    with_aux, without = TrainNet(net, aux=True), TrainNet(net, aux=False)
    x = torch.rand(2, 3, 64, 64)
    assert len(with_aux(x)) == 2 and len(without(x)) == 1
    assert not any(k.startswith("aux") for k in net.state_dict())
    assert any(k.startswith("aux.") for k in with_aux.state_dict())


def test_ciou_matches_torchvision():
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(200, 4, generator=g) * 50, torch.rand(200, 4, generator=g) * 50
    a[:, 2:] += a[:, :2] + 1
    b[:, 2:] += b[:, :2] + 1
    torch.testing.assert_close(1 - ciou(a, b), complete_box_iou_loss(a, b), atol=1e-5, rtol=1e-5)


def test_assigner_picks_anchors_inside_the_box_and_ignores_padding():
    anchors = torch.stack(torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="xy"), -1).view(-1, 2) * 8 + 4
    A = anchors.shape[0]
    gt = torch.tensor([[[8.0, 8.0, 40.0, 40.0], [0.0, 0.0, 64.0, 64.0]]])  # second row is padding
    labels = torch.tensor([[1, 0]])
    mask = torch.tensor([[True, False]])
    pred = torch.cat([anchors - 10, anchors + 10], -1).unsqueeze(0)
    scores = torch.full((1, A, 3), 0.5)
    boxes, t_scores, fg = TaskAlignedAssigner(3, topk=10)(scores, pred, anchors, labels, gt, mask)
    assert 0 < fg.sum() <= 10
    inside = (anchors > 8).all(-1) & (anchors < 40).all(-1)
    assert bool((fg[0] <= inside).all())
    assert torch.equal(boxes[0, fg[0]], gt[0, :1].expand(int(fg.sum()), 4))
    assert bool((t_scores[0, fg[0], 1] > 0).all()) and float(t_scores[0, :, [0, 2]].sum()) == 0.0


def test_loss_is_finite_and_backpropagates_with_padded_targets():
    torch.manual_seed(0)
    tn = TrainNet(YOLO9("t", 3))
    out = tn(torch.rand(2, 3, 64, 64))
    targets = torch.zeros(2, 4, 5)
    targets[0, 0] = torch.tensor([1, 4, 4, 40, 30])
    mask = torch.zeros(2, 4, dtype=torch.bool)
    mask[0, 0] = True
    loss, items = DetectionLoss(3)(out[0], targets, mask, (64, 64), 2.0)
    loss.backward()
    assert torch.isfinite(loss) and items.shape == (3,)
    grads = [p.grad for p in tn.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_model_names_and_missing_pt_message(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    m = LibreYOLO("LibreYOLO9s", nc=5)
    assert m.nc == 5 and m.model_name == "LibreYOLO9s" and not m.trained
    with pytest.raises(
        CheckpointError, match="pretrained=false or model=LibreYOLO9t builds an untrained.*nothing is downloaded"
    ):
        LibreYOLO("LibreYOLO9t.pt")
    assert LibreYOLO("LibreYOLO9t.pt", pretrained=False).model_name == "LibreYOLO9t"
    with pytest.raises(ConfigError, match="LibreYOLO9t"):
        LibreYOLO("yolov99")


def test_checkpoint_roundtrip_and_pickle_refusal(tmp_path):
    m = LibreYOLO("LibreYOLO9t", nc=3)
    path = m.save(tmp_path / "w.pt")
    m2 = LibreYOLO(path)
    assert m2.trained and m2.names == m.names
    for k, v in m.net.state_dict().items():
        assert torch.equal(v, m2.net.state_dict()[k])

    class Evil:
        def __reduce__(self):
            return (print, ("this would run",))

    bad = tmp_path / "evil.pt"
    torch.save({"format": "libreyolo.checkpoint/v1", "x": Evil()}, bad)
    with pytest.raises(CheckpointError, match="execute code"):
        LibreYOLO(bad)
    broken = tmp_path / "broken.pt"
    broken.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        LibreYOLO(broken)


@pytest.mark.parametrize("name,text", [("data.yaml", "path: /data\ntrain: images\n"), ("notes.pt", "hello\n")])
def test_a_text_or_yaml_file_is_not_a_checkpoint_and_no_word_of_pickles(tmp_path, name, text, capsys):
    from libreyolo.cli.main import main

    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(CheckpointError, match=rf"{name} is not a libreyolo checkpoint") as e:
        load_checkpoint(f)
    assert "pickle" not in str(e.value) and "execute" not in str(e.value)
    argv = ["train", f"resume={f}", f"project={tmp_path}", "device=cpu"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{name} is not a libreyolo checkpoint" in err and "pickle" not in err
    with pytest.raises(CheckpointError, match=rf"{name} is not a libreyolo checkpoint: it is not a PyTorch file"):
        LibreYOLO(f)
    assert LibreYOLO(LibreYOLO("LibreYOLO9t", nc=2).save(tmp_path / "w.pth")).nc == 2  # any name loads a checkpoint


def test_batched_heads_loss_equals_separate_calls():
    """Main and auxiliary heads share one loss call; the result must be exactly the weighted sum of two calls."""
    torch.manual_seed(0)
    L = DetectionLoss(3)
    a, b = torch.randn(2, 67, 84, requires_grad=True), torch.randn(2, 67, 84, requires_grad=True)
    tg = torch.zeros(2, 8, 5)
    tg[:, 0] = torch.tensor([1, 4, 4, 40, 30])
    tg[0, 1] = torch.tensor([2, 30, 30, 60, 62])
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[:, 0] = True
    mask[0, 1] = True
    l1, i1 = L(a, tg, mask, (64, 64), 2.0)
    l2, _ = L(b, tg, mask, (64, 64), 2.0)
    ref = l1 + 0.25 * l2
    ga, gb = torch.autograd.grad(ref, (a, b))
    both, items = L(torch.cat((a, b)), tg, mask, (64, 64), 2.0, (1.0, 0.25))
    ga2, gb2 = torch.autograd.grad(both, (a, b))
    torch.testing.assert_close(both, ref)
    torch.testing.assert_close(items, i1)
    torch.testing.assert_close(ga2, ga)
    torch.testing.assert_close(gb2, gb)
