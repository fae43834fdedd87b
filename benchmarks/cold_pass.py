"""A fresh process's first training forward and backward, as the setup's warm-up runs them, and what makes the
first one slow: the CUDA caching allocator growing its memory (one cudaMalloc per new segment), or first use of
the layers' kernels whatever their shapes.

    python benchmarks/cold_pass.py [--reserve-gb G] [--prime-imgsz P [--prime-loss]] [--prime-conv] [--passes N] \
        -- model=LibreYOLO9t batch=16 imgsz=640

Builds the train net (channels_last on a GPU), `bench step`'s batch, then times N passes (the network's forward,
then the loss, under float16 autocast; backward at scale 1), each synchronised. Before them, optionally:
--reserve-gb G allocates and frees G GiB, so that the allocator splits the passes' tensors out of that one segment
instead of asking the driver for each new one (PYTORCH_CUDA_ALLOC_CONF applies as usual); --prime-imgsz P runs one
pass of 2 blank images of P px (the same layers at other shapes; the outputs' sum as the loss, the family's loss
with --prime-loss); --prime-conv runs one Conv block (conv, BatchNorm, SiLU) on a tiny input. Prints one JSON line:
per pass, seconds (network, network + loss, backward) and the segments the allocator made during each
(`segment.all.allocated`), and the priming's or reservation's own time."""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reserve-gb", type=float, default=0.0)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--prime-imgsz", type=int, default=0)
    ap.add_argument("--prime-loss", action="store_true")
    ap.add_argument("--prime-conv", action="store_true")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    from libreyolo.bench.step import DEFAULTS, _batch_on_device
    from libreyolo.config import TrainConfig
    from libreyolo.engine.step import train_forward
    from libreyolo.families import parse_model_name

    cfg = TrainConfig.from_overrides({**DEFAULTS, **dict(o.split("=", 1) for o in a.overrides)})
    device = torch.device("cuda", 0)
    torch.cuda.init()
    out: dict = {"reserve_gb": a.reserve_gb, "model": cfg.model, "batch": cfg.batch, "imgsz": cfg.imgsz}
    if a.reserve_gb:
        t = time.perf_counter()
        block = torch.empty(int(a.reserve_gb * 2**30), dtype=torch.uint8, device=device)
        del block
        torch.cuda.synchronize()
        out["reserve_s"] = round(time.perf_counter() - t, 4)
    family, size = parse_model_name(cfg.model)
    torch.manual_seed(0)
    net = family.build(size, 4)
    train_net = family.train_net(net, cfg).to(device).to(memory_format=torch.channels_last)
    loss_fn = family.loss(net, cfg)
    data, _ = _batch_on_device(cfg, cfg.batch, device)
    imgsz = (data["img"].shape[1], data["img"].shape[2])

    def segments() -> int:
        return int(torch.cuda.memory_stats(device).get("segment.all.allocated", 0))

    if a.prime_conv:  # one Conv block's ops (conv, BatchNorm, SiLU; forward and backward) on a tiny input first
        t = time.perf_counter()
        conv = torch.nn.Sequential(
            torch.nn.Conv2d(16, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16), torch.nn.SiLU()
        ).to(device, memory_format=torch.channels_last)
        x = torch.zeros(2, 16, 32, 32, device=device).to(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.float16):
            y = conv(x)
        y.float().sum().backward()
        torch.cuda.synchronize()
        out["prime_s"] = round(time.perf_counter() - t, 4)
    if a.prime_imgsz:  # the same layers once at a small size first: what of the cold pass does not depend on shapes
        t = time.perf_counter()
        small = torch.zeros(2, a.prime_imgsz, a.prime_imgsz, 3, dtype=torch.uint8, device=device)
        o = train_forward(train_net, small, torch.float16, True)
        if a.prime_loss:
            loss, _ = loss_fn(o, data["targets"][:2], data["mask"][:2], (a.prime_imgsz, a.prime_imgsz), 2.0)
            loss.backward()
        else:
            sum(t.float().sum() for t in (o if isinstance(o, (tuple, list)) else [o])).backward()
        train_net.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        out["prime_s"] = round(time.perf_counter() - t, 4)
        del o
    passes = []
    for _ in range(a.passes):
        torch.cuda.synchronize()
        s0, t0 = segments(), time.perf_counter()
        outputs = train_forward(train_net, data["img"], torch.float16, True)
        torch.cuda.synchronize()
        tn = time.perf_counter()
        loss, _ = loss_fn(outputs, data["targets"], data["mask"], imgsz, float(cfg.batch))
        torch.cuda.synchronize()
        s1, t1 = segments(), time.perf_counter()
        loss.backward()
        torch.cuda.synchronize()
        s2, t2 = segments(), time.perf_counter()
        passes.append(
            {
                "forward_s": round(t1 - t0, 4),
                "network_s": round(tn - t0, 4),
                "backward_s": round(t2 - t1, 4),
                "forward_segments": s1 - s0,
                "backward_segments": s2 - s1,
            }
        )
        del outputs, loss
    out["passes"] = passes
    out["reserved_gb"] = round(torch.cuda.memory_reserved(device) / 2**30, 2)
    out["peak_allocated_gb"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()  # argparse takes the keys after `--` as the positional overrides
