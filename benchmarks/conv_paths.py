"""The Conv blocks' host cost by how they compute: 1x1 convolutions through cuBLAS (a matrix product over the
channels-last pixels) instead of cuDNN, BatchNorm on PyTorch's own kernels instead of cuDNN's, both, or neither.
(`torch.native_batch_norm`: on CUDA, torch 2.11's `torch.batch_norm` with cudnn_enabled=False still ran cuDNN's
BatchNorm in training, as py-spy's stacks showed, so benchmarks/eager_bn.py's "native" form, removed, measured
cuDNN's twice.)

    python benchmarks/conv_paths.py [--rounds 4] [--steps 64] [--variants base,mm,bn,mm+bn] \
        -- model=LibreYOLO9t batch=8 imgsz=640

An experiment (needs a CUDA GPU). The eager step is host-bound on the H200, and of the loop thread's busy time 28%
was cuDNN's own host code (docs/performance.md). All variants run in one process, alternating, on one network:
- eager: `bench step`'s eager runner (the backward overlapped as in training), ms per micro-step back to back;
- serial: the same runner with the backward in the loop;
- full: a whole-step graph captured with the variant (GPU time: the graph's replay), built once per variant and
  round.
First, every variant's forward is compared with base's on one batch in float32 (max abs difference of the raw
outputs). Prints one JSON line per variant and round, then a summary line of medians."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from typing import Any

import torch
import torch.nn.functional as F
from eager_split import EagerBench  # this folder is on sys.path when run as a script

VARIANT = {"mm": False, "bn": False}


def conv_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """nn/blocks.Conv.forward's inline path, with the variant's two switches."""
    from libreyolo.nn.blocks import _inline

    m = self._modules
    conv, bn, act = m["conv"], m["bn"], m["act"]
    if not _inline(conv, bn, act):
        return act(bn(conv(x)))
    p, b = conv._parameters, bn._parameters
    w = p["weight"]
    if VARIANT["mm"] and w.shape[2] == 1 and w.shape[3] == 1 and conv.stride == (1, 1) and conv.groups == 1:
        n, c, h, wd = x.shape
        y = torch.mm(x.permute(0, 2, 3, 1).reshape(n * h * wd, c), w.view(w.shape[0], c).t())
        y = y.view(n, h, wd, w.shape[0]).permute(0, 3, 1, 2)
    else:
        y = F.conv2d(x, w, p["bias"], conv.stride, conv.padding, conv.dilation, conv.groups)
    args = (y, b["weight"], b["bias"], bn._buffers["running_mean"], bn._buffers["running_var"], bn.training)
    if VARIANT["bn"]:  # torch.batch_norm's cudnn_enabled=False does not keep a training BatchNorm off cuDNN
        y = torch.native_batch_norm(*args, bn.momentum, bn.eps)[0]
    else:
        y = torch.batch_norm(*args, bn.momentum, bn.eps, torch.backends.cudnn.enabled)
    return F.silu(y) if type(act) is torch.nn.SiLU else y


def set_variant(name: str) -> None:
    parts = set(name.split("+"))
    VARIANT["mm"], VARIANT["bn"] = "mm" in parts, "bn" in parts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--variants", default="base,mm,bn,mm+bn")
    ap.add_argument("--no-full", action="store_true")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    from libreyolo.bench.step import make_runner, timed_steps
    from libreyolo.nn import blocks

    blocks.Conv.forward = conv_forward  # type: ignore[method-assign]
    variants = a.variants.split(",")
    b = EagerBench.build(a.overrides)
    cfg, device, data, nc, step, acc = b.cfg, b.device, b.data, b.nc, b.step, b.parts.accumulate

    # which backward each BatchNorm form records on this device (cuDNN's or PyTorch's)
    t = torch.randn(2, 8, 4, 4, device=device, requires_grad=True).contiguous(memory_format=torch.channels_last)
    w, bb, rm, rv = (
        torch.ones(8, device=device),
        torch.zeros(8, device=device),
        torch.zeros(8, device=device),
        torch.ones(8, device=device),
    )
    with torch.autocast(device.type, enabled=device.type == "cuda"):
        x16 = t.half() if device.type == "cuda" else t
        forms = {
            "batch_norm": torch.batch_norm(x16, w, bb, rm, rv, True, 0.03, 1e-3, False).grad_fn.name(),
            "native_batch_norm": torch.native_batch_norm(x16, w, bb, rm, rv, True, 0.03, 1e-3)[0].grad_fn.name(),
        }
    print(json.dumps({"batchnorm_backward_recorded": forms}), flush=True)

    # the forward of each variant against base's: float32 without TF32, eval mode (running statistics)
    net = step.net
    img = (data["img"].permute(0, 3, 1, 2).float() / 255).contiguous(memory_format=torch.channels_last)
    diffs = {}
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        net.eval()
        set_variant("base")
        ref = net(img)
        ref = ref if isinstance(ref, (tuple, list)) else (ref,)
        for v in variants:
            set_variant(v)
            out = net(img)
            out = out if isinstance(out, (tuple, list)) else (out,)
            diffs[v] = max(float((o - r).abs().max()) for o, r in zip(out, ref, strict=True) if torch.is_tensor(o))
        net.train()
    torch.backends.cudnn.allow_tf32 = tf32
    print(json.dumps({"max_abs_diff_fp32_eval": diffs, "ref_abs_max": max(float(r.abs().max()) for r in ref)}))

    def window(overlap: bool) -> float:
        step.overlap_backward = overlap and acc > 1
        b.run(acc)  # variant switch: warm the window's shapes
        b.sync()
        t = time.perf_counter()
        b.run(a.steps)
        b.sync()
        return (time.perf_counter() - t) * 1000 / a.steps

    for v in variants:  # each variant's first calls (cuDNN plans, kernels) before any timing
        set_variant(v)
        window(True)
    rows: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in range(a.rounds):
        for v in variants:
            set_variant(v)
            row: dict[str, Any] = {"variant": v, "round": r}
            row["eager_ms"] = window(True)
            row["serial_ms"] = window(False)
            if not a.no_full:
                full, _ = make_runner(cfg, device, nc, "full")
                k = 0

                def one(full: Any = full) -> None:
                    nonlocal k
                    k += 1
                    full(data["img"], data["targets"], data["mask"], k % acc == 0)

                for _ in range(2 * acc):
                    one()
                times, mean_ms = timed_steps(one, a.steps, device.type == "cuda", full.sync)
                row["full_median_ms"], row["full_mean_ms"] = statistics.median(times), mean_ms
                del full
                torch.cuda.empty_cache()
            for key, val in row.items():
                if key.endswith("_ms"):
                    rows[v][key].append(val)
            print(json.dumps({k: round(x, 2) if isinstance(x, float) else x for k, x in row.items()}), flush=True)
    summary = {v: {k: round(statistics.median(x), 2) for k, x in d.items()} for v, d in rows.items()}
    print(
        json.dumps(
            {
                "summary_medians": summary,
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            }
        )
    )


if __name__ == "__main__":
    main()
