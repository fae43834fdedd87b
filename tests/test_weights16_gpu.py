"""tests/test_weights16.py's check on the GPU in float16: LibreYOLO 1.6 and this project, each on the GPU in half
precision, give the same raw outputs of the same checkpoint (float16 rounds: compared at 1e-2)."""

from __future__ import annotations

import pytest
import torch
from test_weights16 import libreyolo16, reference  # noqa: F401  (libreyolo16 is the session fixture)

from libreyolo import LibreYOLO

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize(("family", "size"), [("yolox", "n"), ("yolox", "s"), ("yolo9", "m"), ("yolo9", "c")])
def test_libreyolo16_outputs_in_float16_on_the_gpu(libreyolo16, tmp_path, family, size):  # noqa: F811
    ref = reference(libreyolo16, family, size, 80, tmp_path, "cuda", "float16")
    x = torch.load(tmp_path / "x.pt", weights_only=True).cuda().half()
    model = LibreYOLO(tmp_path / f"libreyolo16_{family}{size}.pt")
    with torch.no_grad():
        raw = model.net.cuda().half().eval()(x).float().cpu()
    torch.testing.assert_close(raw, ref["raw"], atol=1e-2, rtol=1e-2)
