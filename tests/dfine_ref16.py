"""Run inside LibreYOLO 1.6 (on PYTHONPATH; it is also named `libreyolo`): build a randomly initialised D-FINE, save
it as 1.6 saves checkpoints (.pt, and its weights as .safetensors), and write its raw outputs and post-processed
boxes for a fixed input to reference.pt, as tests/weights_ref16.py does for the other families (whose helpers it
uses). tests/test_dfine16.py runs it in a subprocess.

usage: python dfine_ref16.py SIZE NC OUT_DIR   (the input: OUT_DIR/x.pt, RGB in 0..1, as both take it)"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from weights_ref16 import _randomise_bn, _Run


def main(size: str, nc: int, out: Path) -> None:
    from safetensors.torch import save_file

    import libreyolo

    if not hasattr(libreyolo, "LibreDFINE"):
        raise SystemExit(f"expected LibreYOLO 1.6 on PYTHONPATH, imported {libreyolo.__file__}")
    from libreyolo import LibreDFINE
    from libreyolo.postprocess.dfine import postprocess

    torch.manual_seed(0)
    x = torch.load(out / "x.pt", weights_only=True)
    model = LibreDFINE(None, size=size, nb_classes=nc, device="cpu")
    net = model.model.eval()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        _randomise_bn(net)
        # the box and quality heads start at zero (every box its reference): give them weights to compare
        dec = net.decoder
        heads = (dec.pre_bbox_head, *dec.dec_bbox_head, *(q.reg_conf for q in dec.decoder.lqe_layers))
        for head in heads:
            head.layers[-1].weight.copy_(torch.randn(head.layers[-1].weight.shape, generator=g) * 0.05)
        for lin in dec.dec_score_head:
            lin.bias.zero_()
        # a 64 px image has fewer encoder tokens than 300 queries: all of them are queries, as this project does
        tokens = sum((64 // s) ** 2 for s in net.encoder.feat_strides)
        dec.num_queries = tokens
        result = _Run("cpu", torch.float32)(net, x)
    raw = (result["pred_logits"], result["pred_boxes"])
    post = postprocess({"pred_logits": raw[0][:1], "pred_boxes": raw[1][:1]}, 0.001, 0.7, (64, 64), max_det=50)
    model.save(str(out / f"libreyolo16_dfine{size}.pt"))
    # a copy of each tensor: up and reg_scale appear twice, and safetensors refuses shared memory
    save_file({k: v.clone() for k, v in net.state_dict().items()}, str(out / f"libreyolo16_dfine{size}.safetensors"))
    boxes = torch.as_tensor(post["boxes"], dtype=torch.float32).reshape(-1, 4)
    scores = torch.as_tensor(post["scores"], dtype=torch.float32).reshape(-1)
    classes = torch.as_tensor(post["classes"], dtype=torch.float32).reshape(-1)
    ref = {"logits": raw[0], "boxes_raw": raw[1], "boxes": boxes, "scores": scores, "classes": classes}
    torch.save(ref, out / "reference.pt")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
