"""The start of a `libreyolo train` process with ideas patched in, for an A/B on one machine before any of them
goes into the library (needs a CUDA GPU for the ones that touch the warm-up).

    T_LAUNCH=$(date +%s.%N) python benchmarks/start_variants.py VARIANT[,VARIANT...] -- data=... epochs=1 batch=16

Runs the command as `libreyolo train` does (the CUDA driver's start begun before torch is imported) and ends the
process at the first step event, printing one JSON line: seconds from T_LAUNCH (the shell's clock just before it
started Python) to run_start and to the first step, and the wall time of the warm-up's forward, of the loss-scale
search and of the trainer's wait for the warm-up. No sampler runs (start_trace.py's samples take the interpreter
lock every 2 ms). Variants, each patched at run time over the library's own code:
- base: nothing;
- nohooks: no activation hooks for the scale search, whose first guess then comes from the weights' gradients
  alone (bisection finds the same exponent, in more passes): no Python on autograd's thread while the setup runs
  its own;
- switch: the interpreter's switch interval 0.5 ms instead of 5 ms from the warm-up's start to its join, so that
  the search's hooks wait less for the lock;
- optwarm: the optimizer, loss-scaler and EMA update of the whole-step graph (engine/capturable.py) once on a
  throwaway two-layer model in the warm-up's thread after the search, so that the first step finds their kernels
  loaded;
- shapes: the convolutions' and BatchNorms' shapes of the warm-up's forward, recorded by the first process into
  /tmp/libreyolo-shapes-<batch>x<H>x<W>.json; a later process runs each shape once in a helper thread beside the
  warm-up's forward (conv_prewarm.prewarm, which benchmarks/conv_prewarm.py measured alone);
- confirm1: the scale search's passes at scale 1 and at its first guess only, where the library also checks the
  guess plus one: a finite guess is taken as the largest finite exponent (so the run may start one halving lower
  than it could); an overflowing guess bisects below it as before;
- guess: the pass at scale 1 only; its first guess is taken as the largest finite exponent unchecked;
- nofork: neither the validation workers nor the evaluation's child are forked during the setup (the first
  epoch's prefetch and the first evaluation fork them, as before d0a6341 and 2b697c0);
- earlyfork: the validation workers are forked as soon as their loader exists, before the training workers and the
  warm-up, instead of beside the warm-up's backward (the library's own order since bf8c603: no change on it);
- evalearly: the evaluation's child is forked just before the validation workers, instead of while the setup waits
  for the warm-up's backward;
- serial: the setup waits for the warm-up's backward (the search) right after its forward, instead of building the
  optimizer, EMA, step runner and validation beside it: whether that backward is slower for what runs beside it;
- stream: no cache: hooks on the warm-up copy's convolutions and BatchNorms hand each new shape, as the warm-up's
  forward reaches it, to a helper thread that runs that layer's forward and backward once on constant tensors of the
  same shape, dtype and memory format (no random numbers drawn), so the backward's kernels load while the forward
  runs; the warm-up's backward starts once the helper has drained its queue;
- valnopin: the validation loader without page-locking (no torch pin-memory thread page-locking its queued batches
  while the train net moves to the GPU and the warm-up runs; validation would then copy from pageable memory);
- prepin: a thread begun right after `import torch` allocates and frees the page-locked blocks the setup's pinning
  will ask torch's host allocator for (the training stager's slots, seven validation batches), so that they are
  cached before the net moves to the GPU.
Each run also prints when the warm-up started (`warmup_start_s`: the setup's work before it, the net's move
included). Every variant prints the search's passes (exponent, finite, seconds) and the first guess.
What each did to the start on the H200: docs/performance.md, fourteenth session (none adopted) and the sections of
2026-12-04 (earlyfork adopted; valnopin and prepin: fourth session, not adopted)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

T0 = float(os.environ.get("T_LAUNCH", time.time()))
VARIANTS = (
    "base",
    "nohooks",
    "switch",
    "optwarm",
    "shapes",
    "stream",
    "confirm1",
    "guess",
    "serial",
    "nofork",
    "earlyfork",
    "evalearly",
    "valnopin",
    "prepin",
)
PASSES: list[list[Any]] = []  # the scale search's passes in this process: [exponent, finite, seconds]; the guess


def main(variants: list[str], args: list[str]) -> None:
    from libreyolo.cli import cudastart

    cudastart.start(["train", *args])
    import torch

    if "prepin" in variants:
        prepin(torch, args)

    import libreyolo.cli.main as cli_main
    from libreyolo.engine import lossscale, trainer, warmup
    from libreyolo.engine.bytecode import uncached_bytecode_note

    # False: torch has no bytecode cache, so every start compiles it from source and is not comparable with one
    # that reads the cache (`import torch` 3.4-3.7 s against 1.6-1.9 s on the H200's image, which sets
    # PYTHONDONTWRITEBYTECODE); True also for the one process that wrote the cache
    out: dict[str, Any] = {"variants": variants, "torch_bytecode_cached": uncached_bytecode_note(torch) is None}
    spans: dict[str, float] = {}

    def timed(owner: Any, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def run(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spans[label] = spans.get(label, 0.0) + time.perf_counter() - t

        setattr(owner, name, run)

    for v in variants:
        apply(v, torch, lossscale, warmup)
    record_passes(lossscale)  # around whichever search a variant put in place
    start = warmup.KernelWarmup.start

    def start_marked(self: Any, *a: Any, **k: Any) -> Any:
        out["warmup_start_s"] = round(time.time() - T0, 3)
        return start(self, *a, **k)

    warmup.KernelWarmup.start = start_marked
    timed(warmup.KernelWarmup, "_forward", "warmup_forward_s")
    forward = warmup.KernelWarmup._forward

    def forward_marked(self: Any, *a: Any, **k: Any) -> Any:
        try:
            return forward(self, *a, **k)
        finally:
            out["forward_end_s"] = round(time.time() - T0, 3)

    warmup.KernelWarmup._forward = forward_marked
    timed(lossscale.ScaleSearch, "search", "search_s")
    timed(warmup.KernelWarmup, "join", "join_s")
    emit = trainer.Trainer.emit

    def emitted(self: Any, e: Any) -> None:
        emit(self, e)
        if e.type == "run_start":
            out["run_start_s"] = round(time.time() - T0, 3)
        elif e.type == "step":
            out["first_step_s"] = round(time.time() - T0, 3)
            if "forward_end_s" in out:  # no warm-up (CPU, DDP, cuDNN timing on): no forward to count from
                out["forward_end_to_first_step_s"] = round(out["first_step_s"] - out["forward_end_s"], 3)
            out.update({k: round(v, 3) for k, v in spans.items()})
            out["passes"] = PASSES
            if "stream" in variants:
                out["stream_wait_s"] = round(STREAM_WAIT[0], 3)
            print(json.dumps(out), flush=True)
            os._exit(0)

    trainer.Trainer.emit = emitted  # type: ignore[method-assign]
    cli_main.main(["train", *args])
    print(json.dumps({**out, "error": "the run ended before its first step"}), flush=True)
    os._exit(1)


def apply(variant: str, torch: Any, lossscale: Any, warmup: Any) -> None:
    KW = warmup.KernelWarmup
    if variant == "nohooks":
        lossscale.ScaleSearch.watch = lambda self, net: []
    elif variant == "switch":
        start, join = KW.start, KW.join

        def start_fast(self: Any, *a: Any, **k: Any) -> Any:
            sys.setswitchinterval(0.0005)
            return start(self, *a, **k)

        def join_restore(self: Any) -> None:
            join(self)
            sys.setswitchinterval(0.005)

        KW.start, KW.join = start_fast, join_restore
    elif variant == "optwarm":
        backward = KW._backward

        def backward_then_update(self: Any, *a: Any, **k: Any) -> None:
            backward(self, *a, **k)
            try:
                update_once(torch, self.device)
            except Exception as e:  # noqa: BLE001
                print(f"optwarm failed: {type(e).__name__}: {e}", file=sys.stderr)

        KW._backward = backward_then_update
    elif variant == "shapes":
        patch_shapes(torch, KW)
    elif variant in ("confirm1", "guess"):
        lossscale.largest_finite_exp = confirm1 if variant == "confirm1" else guess_only
    elif variant == "stream":
        patch_stream(torch, KW)
    elif variant == "nofork":
        from libreyolo.engine import epochval, setup

        setup.start_val_workers = lambda *a, **k: None  # forked by the first epoch's prefetch instead
        epochval.EvalProcess.start = lambda self: None  # forked at the first evaluation instead
    elif variant == "earlyfork":
        from libreyolo.engine import setup

        make_val_loader = setup.val_loader

        def val_loader_primed(*a: Any, **k: Any) -> Any:
            vl = make_val_loader(*a, **k)
            if vl.persistent_workers:
                vl.prefetch()
            return vl

        setup.val_loader = val_loader_primed
    elif variant == "evalearly":
        from libreyolo.engine import epochval, setup

        make_val_loader, made = setup.val_loader, epochval.EvalProcess()

        def val_loader_and_child(*a: Any, **k: Any) -> Any:
            made.start()
            return make_val_loader(*a, **k)

        setup.val_loader = val_loader_and_child
        epochval.EvalProcess = lambda: made  # type: ignore[assignment,misc]
    elif variant == "serial":
        start = KW.start

        def start_then_join(self: Any, *a: Any, **k: Any) -> None:
            start(self, *a, **k)
            self.join()

        KW.start = start_then_join
    elif variant == "valnopin":
        from libreyolo.engine import setup

        make_val_loader = setup.val_loader

        def val_loader_unpinned(dataset: Any, batch: int, workers: int, pin: bool, *a: Any, **k: Any) -> Any:
            return make_val_loader(dataset, batch, workers, False, *a, **k)

        setup.val_loader = val_loader_unpinned
    elif variant not in ("base", "prepin"):
        raise SystemExit(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")


def prepin(torch: Any, args: list[str]) -> None:
    """In a thread begun right after `import torch`: page-locked blocks of torch's host allocator for the staged
    training batches (SLOTS of batch x imgsz^2 x 3 bytes) and seven validation batches of min(2 batch, 64) images
    (the race's 200 validation images), allocated and freed, so that the setup's pinning reuses them instead of
    calling cudaHostAlloc while the net moves to the GPU and the warm-up runs."""
    keys = dict(a.split("=", 1) for a in args if "=" in a)
    batch, imgsz = int(keys.get("batch", 16)), int(keys.get("imgsz", 640))

    def run() -> None:
        from libreyolo.data import staging

        blocks = [batch * imgsz * imgsz * 3] * staging.SLOTS + [min(2 * batch, 64) * imgsz * imgsz * 3] * 7
        t = time.perf_counter()
        held = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for n in blocks]
        del held
        print(f"prepin: {len(blocks)} blocks in {time.perf_counter() - t:.3f} s", file=sys.stderr)

    threading.Thread(target=run, name="prepin", daemon=True).start()


def record_passes(lossscale: Any) -> None:
    """The search's passes timed (each ends in its host read) into PASSES, whichever search runs them."""
    orig = lossscale.largest_finite_exp

    def recorded(finite_at: Any, hi: int = lossscale.MAX_EXP, guess: Any = None) -> Any:
        def timed(e: int) -> bool:
            t = time.perf_counter()
            ok = finite_at(e)
            PASSES.append([e, ok, round(time.perf_counter() - t, 4)])
            return ok

        def guessed() -> int:
            g = guess()
            PASSES.append(["guess", g])
            return g

        return orig(timed, hi, guessed if guess is not None else None)

    lossscale.largest_finite_exp = recorded


def confirm1(finite_at: Any, hi: int = 24, guess: Any = None) -> int | None:
    if not finite_at(0):
        return None
    from libreyolo.engine.lossscale import bisect_largest

    g = min(max(guess(), 0), hi) if guess is not None else hi
    if g == 0 or finite_at(g):
        return g
    return bisect_largest(finite_at, 0, g - 1)


def guess_only(finite_at: Any, hi: int = 24, guess: Any = None) -> int | None:
    if not finite_at(0):
        return None
    return min(max(guess(), 0), hi) if guess is not None else 0


def update_once(torch: Any, device: Any) -> None:
    """CapturableUpdate.step() on a model of one convolution and one BatchNorm, made on the meta device and then
    zeroed on the GPU (the random generators are left alone), with AdamW, an enabled scaler and an EMA."""
    from torch import nn

    from libreyolo.engine.capturable import CapturableUpdate
    from libreyolo.engine.ema import ModelEMA
    from libreyolo.engine.flat import FlatParams

    with torch.device("meta"):
        m = nn.Sequential(nn.Conv2d(4, 4, 1, bias=False), nn.BatchNorm2d(4))
    m = m.to_empty(device=device)
    with torch.no_grad():
        for t in [*m.parameters(), *m.buffers()]:
            t.zero_()
    flat = FlatParams(m, torch.float16, channels_last=True)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(device.type, init_scale=16.0)
    update = CapturableUpdate(opt, "AdamW", scaler, ModelEMA(m), 10.0, flat, device)
    update.load_hyper()
    update.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def patch_shapes(torch: Any, KW: Any) -> None:
    from conv_prewarm import prewarm  # this folder is on sys.path when run as a script
    from torch import nn

    forward, join = KW._forward, KW.join
    helpers: list[threading.Thread] = []

    def cache_for(self: Any) -> Path:
        img = self.make_batch()["img"]
        return Path(f"/tmp/libreyolo-shapes-{'x'.join(str(s) for s in img.shape[:3])}.json")

    def tuples(v: Any) -> Any:  # JSON gives lists back; prewarm's shapes are tuples (it keeps a set of them)
        return tuple(tuples(x) for x in v) if isinstance(v, list) else v

    def forward_with_shapes(self: Any, net: Any, autocast_dtype: Any, channels_last: bool, scale: float) -> Any:
        path = cache_for(self)
        if path.is_file():
            shapes = json.loads(path.read_text())
            dtype = autocast_dtype or torch.float32
            args = (tuples(shapes["convs"]), tuples(shapes["bns"]), self.device, dtype, channels_last)
            th = threading.Thread(target=prewarm, args=args, daemon=True)
            th.start()
            helpers.append(th)
            return forward(self, net, autocast_dtype, channels_last, scale)
        convs: list[list[Any]] = []
        bns: list[list[Any]] = []

        def conv_hook(m: Any, a: Any) -> None:
            padding = m.padding if isinstance(m.padding, str) else list(m.padding)
            convs.append([list(a[0].shape), list(m.weight.shape), m.bias is not None, list(m.stride), padding])
            convs[-1] += [list(m.dilation), m.groups]

        def norm_hook(m: Any, a: Any) -> None:
            bns.append([list(a[0].shape), True])

        hooks = [
            m.register_forward_pre_hook(conv_hook if isinstance(m, nn.Conv2d) else norm_hook)
            for m in net.modules()
            if isinstance(m, (nn.Conv2d, nn.BatchNorm2d))
        ]
        try:
            return forward(self, net, autocast_dtype, channels_last, scale)
        finally:
            for h in hooks:
                h.remove()
            path.write_text(json.dumps({"convs": convs, "bns": bns}))

    def join_helpers(self: Any) -> None:
        for th in helpers:
            th.join()
        helpers.clear()
        join(self)

    KW._forward, KW.join = forward_with_shapes, join_helpers


def patch_stream(torch: Any, KW: Any) -> None:
    import queue

    from conv_prewarm import conv_once, norm_once  # this folder is on sys.path when run as a script
    from torch import nn

    forward = KW._forward

    def constant(shape: Any, device: Any, dtype: Any) -> Any:  # draws no random numbers, unlike torch.randn
        return torch.full(shape, 0.5, device=device, dtype=dtype)

    def helper(q: Any) -> None:
        dev = torch.device("cuda")
        while (item := q.get()) is not None:
            kind, shape, dtype, fmt, rest = item
            try:
                if kind == "conv":
                    conv_once((shape, *rest), dev, dtype, fmt, constant)
                else:
                    norm_once(shape, dev, dtype, fmt, constant)
            except Exception as e:  # noqa: BLE001
                print(f"stream helper: {type(e).__name__}: {e}", file=sys.stderr)

    def forward_streaming(self: Any, net: Any, autocast_dtype: Any, channels_last: bool, scale: float) -> Any:
        q: Any = queue.SimpleQueue()
        seen: set[Any] = set()
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        dtype = autocast_dtype or torch.float32

        def conv_hook(m: Any, a: Any) -> None:
            padding = m.padding if isinstance(m.padding, str) else tuple(m.padding)
            rest = (tuple(m.weight.shape), m.bias is not None, tuple(m.stride), padding, tuple(m.dilation), m.groups)
            key = ("conv", tuple(a[0].shape), rest)
            if key not in seen and a[0].dim() == 4:
                seen.add(key)
                q.put(("conv", tuple(a[0].shape), dtype, fmt, rest))

        def norm_hook(m: Any, a: Any) -> None:
            key = ("bn", tuple(a[0].shape), a[0].dtype)
            if key not in seen and a[0].dim() == 4:
                seen.add(key)
                q.put(("bn", tuple(a[0].shape), a[0].dtype, fmt, None))

        hooks = [
            m.register_forward_pre_hook(conv_hook if isinstance(m, nn.Conv2d) else norm_hook)
            for m in net.modules()
            if isinstance(m, (nn.Conv2d, nn.BatchNorm2d))
        ]
        th = threading.Thread(target=helper, args=(q,), name="stream-prewarm", daemon=True)
        th.start()
        try:
            return forward(self, net, autocast_dtype, channels_last, scale)
        finally:
            for h in hooks:
                h.remove()
            q.put(None)
            t = time.perf_counter()
            th.join()
            STREAM_WAIT[0] = time.perf_counter() - t

    KW._forward = forward_streaming


STREAM_WAIT = [0.0]


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        raise SystemExit(__doc__)
    chosen = sys.argv[1].split(",")
    bad = [v for v in chosen if v not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown variant(s) {bad}: choose from {', '.join(VARIANTS)}")
    main(chosen, sys.argv[3:])
