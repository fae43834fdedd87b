"""Run inside LibreYOLO 1.6 (on PYTHONPATH; it is also named `libreyolo`): build a randomly initialised RTMDet, save it
as 1.6 saves checkpoints (.pt, and its weights as .safetensors), and write its raw head outputs and post-processed
boxes for a fixed input to reference.pt, as tests/weights_ref16.py does for the other families (whose helpers it
uses). tests/test_rtmdet16.py runs it in a subprocess.

usage: python rtmdet_ref16.py SIZE NC OUT_DIR   (the input: OUT_DIR/x.pt, RGB in 0..1, as this project's networks
take it; 1.6's RTMDet takes BGR normalised by mmdetection's BGR mean and std)"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from weights_ref16 import _randomise_bn, _Run

MEAN_BGR = torch.tensor([103.53, 116.28, 123.675]).view(1, 3, 1, 1)
STD_BGR = torch.tensor([57.375, 57.12, 58.395]).view(1, 3, 1, 1)


def main(size: str, nc: int, out: Path) -> None:
    from safetensors.torch import save_file

    import libreyolo

    if not hasattr(libreyolo, "LibreRTMDet"):
        raise SystemExit(f"expected LibreYOLO 1.6 on PYTHONPATH, imported {libreyolo.__file__}")
    from libreyolo import LibreRTMDet
    from libreyolo.postprocess.rtmdet import postprocess

    torch.manual_seed(0)
    x = torch.load(out / "x.pt", weights_only=True)
    model = LibreRTMDet(None, size=size, nb_classes=nc, device="cpu")
    net = model.model.eval()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        _randomise_bn(net)
        # the head starts at boxes of no size and scores of 0.01: give it boxes and scores to compare
        for conv in (*net.head.rtm_reg, *net.head.rtm_cls):
            conv.weight.copy_(torch.randn(conv.weight.shape, generator=g) * 0.05)
        for conv in net.head.rtm_reg:
            conv.bias.fill_(0.5 if net.head.exp_on_reg else 1.5)
        for conv in net.head.rtm_cls:
            conv.bias.zero_()
        cls_scores, bbox_preds = _Run("cpu", torch.float32)(net, (x.flip(1) * 255.0 - MEAN_BGR) / STD_BGR)
    raw = torch.cat([torch.cat((r, c), 1).flatten(2) for r, c in zip(bbox_preds, cls_scores)], 2).transpose(1, 2)
    post = postprocess(([c[:1] for c in cls_scores], [r[:1] for r in bbox_preds]), 0.001, 0.7, x.shape[-1], max_det=50)
    model.save(str(out / f"libreyolo16_rtmdet{size}.pt"))
    # a copy of each tensor: the head's shared convolutions appear once per level, and safetensors refuses shared memory
    save_file({k: v.clone() for k, v in net.state_dict().items()}, str(out / f"libreyolo16_rtmdet{size}.safetensors"))
    boxes = torch.as_tensor(post["boxes"], dtype=torch.float32).reshape(-1, 4)
    scores = torch.as_tensor(post["scores"], dtype=torch.float32).reshape(-1)
    classes = torch.as_tensor(post["classes"], dtype=torch.float32).reshape(-1)
    torch.save({"raw": raw, "boxes": boxes, "scores": scores, "classes": classes}, out / "reference.pt")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
