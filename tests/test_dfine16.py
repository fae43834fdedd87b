"""LibreYOLO 1.6's D-FINE checkpoints (the official layout) load here and compute what 1.6 computes: 1.6 (installed
once into a folder of its own, run in a subprocess: tests/dfine_ref16.py) builds a randomly initialised D-FINE,
saves it (.pt as 1.6 saves, and its weights as .safetensors) and writes its raw outputs and post-processed boxes
for a fixed input; this project loads the files and must give the same raw outputs (within 1e-4, float32, eval
mode) and the same boxes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_weights16 import assert_same_boxes, libreyolo16, run_reference  # noqa: F401  (a fixture)

from libreyolo import LibreYOLO
from libreyolo.errors import CheckpointError
from libreyolo.families.dfine.convert import ours

REF_SCRIPT = Path(__file__).with_name("dfine_ref16.py")


def reference(folder: Path, size: str, nc: int, out: Path) -> dict[str, torch.Tensor]:
    return run_reference(REF_SCRIPT, folder, [size, str(nc), str(out)], out)


@pytest.mark.parametrize("size", ["n", "s"])  # two levels and HGNetv2-B0 (n), three levels (s); m is s's layout on B2
def test_libreyolo16_dfine_checkpoint_gives_its_outputs(libreyolo16, tmp_path, size):  # noqa: F811
    ref = reference(libreyolo16, size, 3, tmp_path)
    x = torch.load(tmp_path / "x.pt", weights_only=True)
    for suffix in (".pt", ".safetensors"):
        model = LibreYOLO(tmp_path / f"libreyolo16_dfine{size}{suffix}")
        assert model.model_name == f"LibreDFINE{size}" and model.nc == 3 and "D-FINE" in model.loaded_note
        net = model.net.eval()
        with torch.no_grad():
            logits, boxes = net(x)
        torch.testing.assert_close(logits, ref["logits"], atol=1e-4, rtol=0)
        torch.testing.assert_close(boxes, ref["boxes_raw"], atol=1e-4, rtol=0)
        # 1.6 keeps the best (query, class) pairs, as multi_label does
        got = model.family.postprocess(net, (logits[:1], boxes[:1]), (64, 64), 0.001, 0.7, 50, True)
        assert_same_boxes(got, ref)
    assert model.names == ["class0", "class1", "class2"]  # a .safetensors carries no names
    model = LibreYOLO(tmp_path / f"libreyolo16_dfine{size}.pt")
    assert model.names == ["class_0", "class_1", "class_2"] and model.imgsz == 640
    assert "LibreYOLO 1.6 D-FINE checkpoint" in model.loaded_note


def test_renaming_rules_on_each_kind_of_official_name():
    """One official name of each module kind renamed as this project names it (the 1.6 test above loads every
    tensor of n and s strictly; m has s's names on a larger backbone)."""
    assert ours("encoder.downsample_convs.1.0.cv2.norm.running_var") == "features.encoder.down.1.1.1.running_var"
    assert ours("encoder.fpn_blocks.0.cv3.0.bottlenecks.1.conv2.conv.weight") == (
        "features.encoder.fpn.0.cv3.0.blocks.1.conv2.0.weight"
    )
    assert ours("encoder.encoder.0.layers.0.norm2.bias") == "features.encoder.aifi.norm2.bias"
    assert ours("decoder.decoder.layers.2.gateway.gate.weight") == "decoder.layers.2.norm2.gate.weight"
    assert ours("backbone.stages.2.blocks.1.layers.0.conv2.lab.scale") == (
        "features.backbone.stages.2.blocks.1.layers.0.conv2.lab.scale"
    )


def test_an_official_l_checkpoint_is_refused_naming_the_sizes(tmp_path):
    t = {
        "encoder.lateral_convs.0.conv.weight": torch.zeros(256, 256, 1, 1),
        "encoder.input_proj.0.conv.weight": torch.zeros(256, 512, 1, 1),
        "encoder.input_proj.1.conv.weight": torch.zeros(256, 1024, 1, 1),
        "encoder.input_proj.2.conv.weight": torch.zeros(256, 2048, 1, 1),
        "decoder.pre_bbox_head.layers.0.weight": torch.zeros(256, 256),
        "decoder.dec_score_head.0.bias": torch.zeros(80),
    }
    torch.save({"ema": {"module": t}}, tmp_path / "dfine_hgnetv2_l_coco.pth")
    with pytest.raises(CheckpointError, match=r"not one of the sizes built here \(n, s, m"):
        LibreYOLO(tmp_path / "dfine_hgnetv2_l_coco.pth")
