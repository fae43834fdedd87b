"""Run inside LibreYOLO 1.6 (installed in a folder of its own, on PYTHONPATH; it is also named `libreyolo`):
build a randomly initialised model, save it as 1.6 saves checkpoints (.pt, and its weights as .safetensors), and
write its raw head outputs and post-processed boxes for a fixed input to reference.pt. tests/test_weights16.py runs
this in a subprocess and compares this project's outputs with them.

usage: python weights_ref16.py FAMILY SIZE NC OUT_DIR [DEVICE DTYPE]   (FAMILY: yolo9, yolox, rtdetr, resnet,
mnv4; the input: tensors in OUT_DIR/x.pt, RGB in 0..1, as this project's networks take it; DEVICE cpu or cuda,
DTYPE float32 or float16: the forward runs there, the saved files and outputs are float32 on the CPU)"""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def main(family: str, size: str, nc: int, out: Path, device: str = "cpu", dtype: str = "float32") -> None:
    from safetensors.torch import save_file

    import libreyolo

    if not hasattr(libreyolo, "LibreYOLO9"):  # this project's libreyolo came first on the path
        raise SystemExit(f"expected LibreYOLO 1.6 on PYTHONPATH, imported {libreyolo.__file__}")
    torch.manual_seed(0)
    x = torch.load(out / "x.pt", weights_only=True)
    run = _Run(device, getattr(torch, dtype))
    if family == "yolo9":
        from libreyolo import LibreYOLO9
        from libreyolo.postprocess.yolo9 import postprocess

        model = LibreYOLO9(None, size=size, nb_classes=nc, device="cpu")
        net = model.model.eval()
        with torch.no_grad():
            # 1.6's random init leaves BatchNorm at identity: give its statistics values so they are compared too
            _randomise_bn(net)
            for tower in net.head.cv3:  # its class prior (-10) leaves no box above any threshold: compare boxes
                tower[-1].bias.zero_()
            result = run(net, x)
        raw = torch.cat([r.flatten(2) for r in result["raw_outputs"]], 2)  # (B, 4 * 16 + nc, anchors)
        post = postprocess({"predictions": result["predictions"][:1]}, 0.001, 0.7, x.shape[-1], max_det=50)
    elif family in ("resnet", "mnv4"):  # the network alone: 1.6 normalises its input by ImageNet's mean/std first
        from libreyolo import LibreMobileNetV4, LibreResNet

        build = LibreResNet if family == "resnet" else LibreMobileNetV4
        model = build(None, size=size, nb_classes=nc, device="cpu")
        net = model.model.eval()
        with torch.no_grad():
            _randomise_bn(net)
            raw = run(net, x)
        post = {"boxes": [], "scores": [], "classes": []}
    elif family == "rtdetr":
        raw, post, model, net = _rtdetr(size, nc, x, run)
    else:
        from libreyolo import LibreYOLOX
        from libreyolo.postprocess.yolox import postprocess

        model = LibreYOLOX(None, size=size, nb_classes=nc, device="cpu")
        net = model.model.eval()
        head = net.head
        got: dict[str, list[torch.Tensor]] = {"reg": [], "obj": [], "cls": []}
        for name, convs in (("reg", head.reg_preds), ("obj", head.obj_preds), ("cls", head.cls_preds)):
            for conv in convs:
                conv.register_forward_hook(lambda m, i, o, name=name: got[name].append(o))
        with torch.no_grad():
            _randomise_bn(net)
            levels = run(net, x.flip(1) * 255.0)  # 1.6's YOLOX takes BGR in 0..255
        raw = (
            torch.cat([torch.cat((r, o, c), 1).flatten(2) for r, o, c in zip(got["reg"], got["obj"], got["cls"])], 2)
            .transpose(1, 2)
            .float()
            .cpu()
        )  # (B, anchors, 5 + nc)
        post = postprocess([lvl[:1] for lvl in levels], 0.001, 0.7, x.shape[-1], max_det=50)
    model.save(str(out / f"libreyolo16_{family}{size}.pt"))
    save_file(
        {k: v.contiguous() for k, v in net.state_dict().items()}, str(out / f"libreyolo16_{family}{size}.safetensors")
    )
    boxes = torch.as_tensor(post["boxes"], dtype=torch.float32).reshape(-1, 4)
    scores = torch.as_tensor(post["scores"], dtype=torch.float32).reshape(-1)
    classes = torch.as_tensor(post["classes"], dtype=torch.float32).reshape(-1)
    torch.save({"raw": raw, "boxes": boxes, "scores": scores, "classes": classes}, out / "reference.pt")


def _rtdetr(size: str, nc: int, x: torch.Tensor, run: _Run) -> tuple:
    """1.6's RT-DETR (the official layout) with every tensor random: its backbone's ImageNet weights would be
    downloaded, so none are asked for; the zero-initialised heads and attention weights get small random values
    so that every tensor changes the outputs."""
    import libreyolo.models.rtdetr.model as rtdetr16
    from libreyolo import LibreRTDETR
    from libreyolo.postprocess.rtdetr import postprocess

    for cfg in rtdetr16.RTDETR_CONFIGS.values():
        cfg["backbone_pretrained"] = False
    model = LibreRTDETR(None, size=size, nb_classes=nc, device="cpu")
    net = model.model.eval()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        _randomise_bn(net)
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
        out = run(net, x)
    raw = (out["pred_logits"], out["pred_boxes"])
    post = postprocess({k: v[:1] for k, v in out.items()}, 0.001, 0.7, (x.shape[-1], x.shape[-2]), max_det=50)
    return raw, post, model, net


class _Run:
    """A forward on the device and dtype asked for; the network goes back to the CPU in float32 afterwards (its
    files are saved from there), its outputs come back as float32 CPU tensors."""

    def __init__(self, device: str, dtype: torch.dtype):
        self.device, self.dtype = device, dtype

    def __call__(self, net: torch.nn.Module, x: torch.Tensor):
        out = net.to(self.device, self.dtype)(x.to(self.device, self.dtype))
        net.to("cpu", torch.float32)
        return _back(out)


def _back(out):
    if isinstance(out, torch.Tensor):
        return out.float().cpu()
    if isinstance(out, dict):
        return {k: _back(v) for k, v in out.items()}
    if isinstance(out, (list, tuple)):
        return type(out)(_back(v) for v in out)
    return out


def _randomise_bn(net: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(1)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
            m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
            m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]), *sys.argv[5:7])
