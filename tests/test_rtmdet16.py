"""LibreYOLO 1.6's RTMDet checkpoints load here and compute what 1.6 computes (tests/rtmdet_ref16.py builds them in a
subprocess, as tests/test_weights16.py does for the other families): the same raw head outputs within 1e-4 (float32,
eval mode) and the same boxes after post-processing; and the files written back in 1.6's and mmdetection's layouts
read again to the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_weights16 import assert_same_boxes, libreyolo16, run_reference  # noqa: F401  (a fixture)

from libreyolo import LibreYOLO
from libreyolo.errors import CheckpointError
from libreyolo.weights import write

REF_SCRIPT = Path(__file__).with_name("rtmdet_ref16.py")


def reference(folder: Path, size: str, nc: int, out: Path) -> dict[str, torch.Tensor]:
    return run_reference(REF_SCRIPT, folder, [size, str(nc), str(out)], out)


@pytest.mark.parametrize("size", ["t", "m"])  # a distance head (t) and an exp-distance head (m)
def test_libreyolo16_rtmdet_checkpoint_gives_its_outputs(libreyolo16, tmp_path, size):  # noqa: F811
    ref = reference(libreyolo16, size, 3, tmp_path)
    x = torch.load(tmp_path / "x.pt", weights_only=True)
    for suffix in (".pt", ".safetensors"):
        model = LibreYOLO(tmp_path / f"libreyolo16_rtmdet{size}{suffix}")
        assert model.model_name == f"LibreRTMDet{size}" and model.nc == 3 and "RTMDet" in model.loaded_note
        net = model.net.eval()
        with torch.no_grad():
            raw = net(x)
        torch.testing.assert_close(raw, ref["raw"], atol=1e-4, rtol=0)
        assert_same_boxes(model.family.postprocess(net, raw[:1], (64, 64), 0.001, 0.7, 50, True), ref)
    assert model.names == ["class0", "class1", "class2"]  # a .safetensors carries no names
    model = LibreYOLO(tmp_path / f"libreyolo16_rtmdet{size}.pt")
    assert model.names == ["class_0", "class_1", "class_2"] and model.imgsz == 640
    assert "LibreYOLO 1.6 RTMDet checkpoint" in model.loaded_note


def test_written_layouts_read_back_to_the_same_weights(tmp_path):
    from safetensors.torch import save_file

    m = LibreYOLO("LibreRTMDett", nc=4)
    own = m.net.state_dict()
    for fmt, head in (("RTMDet weights in mmdetection", "bbox_head."), ("LibreYOLO 1.6", "head.")):
        theirs = write(m.family, "t", own, fmt)
        assert f"{head}cls_convs.2.1.conv.weight" in theirs and f"{head}reg_convs.1.0.bn.running_var" in theirs
        save_file(theirs, str(tmp_path / "w.safetensors"))
        back = LibreYOLO(tmp_path / "w.safetensors")
        assert back.model_name == "LibreRTMDett" and back.nc == 4
        got = back.net.state_dict()
        assert got.keys() == own.keys() and all(torch.equal(got[k], own[k]) for k in own)
    # levels whose "shared" convolution differs are another head (share_conv=False): refused with that reason
    theirs["head.cls_convs.1.0.conv.weight"] += 1
    save_file(theirs, str(tmp_path / "w.safetensors"))
    with pytest.raises(CheckpointError, match="share_conv=False"):
        LibreYOLO(tmp_path / "w.safetensors")
