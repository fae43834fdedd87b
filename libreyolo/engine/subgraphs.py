"""cuda_graph=true for a capture plan that names submodules (e.g. a transformer's backbone and encoder): each
named module's forward and backward are captured as graphs of their own, and the rest of the train net (a
decoder with data-dependent shapes, say) runs eagerly around them, autograd joining the two.

A captured module takes one tensor and returns a tensor or a tuple of tensors. Its graphs read the
half-precision stand-ins of its weights (engine/flat.py) and add its weight gradients straight into the flat
gradient buffer; the gradient for its input goes back into the eager autograd graph. Input shapes are read
once per capture with a no-grad eval-mode forward (which leaves BatchNorm statistics untouched); a module fed the
network input itself gets no input gradient."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from libreyolo.nn import streams


class _ModuleGraph:
    def __init__(self, x: torch.Tensor) -> None:
        self.fwd, self.bwd = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        self.x = x
        self.outs: tuple[torch.Tensor, ...] = ()
        self.grad_outs: list[torch.Tensor] = []
        self.grad_x: torch.Tensor | None = None
        self.single = True  # the module returns one tensor, not a tuple
        # a stand-in weight of the module, passed to the autograd function so that its output requires grad
        # (and its backward runs, adding the weight gradients) even when x does not (the network input)
        self.anchor: torch.Tensor | None = None
        self.name = ""
        self.owner: SubmoduleGraphs | None = None


def _run(g: _ModuleGraph, graph: torch.cuda.CUDAGraph, what: str) -> None:
    """Replay one of the module's graphs: under a profiler label (the trace shows the captured share of the
    forward and backward phases), and between CUDA events while `bench step` times the captured part."""
    timings = g.owner.timings if g.owner is not None else None
    with torch.profiler.record_function(f"captured {g.name} {what}"):
        if timings is None:
            graph.replay()
            return
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        timings.append((a, b))


# what SubmoduleGraphs.capture makes: each captured submodule's graphs by its name
CapturedParts = dict[str, _ModuleGraph]


class _Replay(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, g: _ModuleGraph, x: torch.Tensor, anchor: torch.Tensor) -> Any:
        g.x.copy_(x)
        _run(g, g.fwd, "forward")
        ctx.g = g
        outs = tuple(o.detach() for o in g.outs)  # the graph's static buffers, overwritten by the next replay
        return outs[0] if g.single else outs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        g = ctx.g
        for dst, gr in zip(g.grad_outs, grads):
            dst.copy_(gr) if gr is not None else dst.zero_()
        _run(g, g.bwd, "backward")
        return None, g.grad_x.detach() if ctx.needs_input_grad[1] and g.grad_x is not None else None, None


class SubmoduleGraphs:
    """The submodules a capture plan names, their graphs per train-net input shape, and the forward that replays
    them while a step runs under `active(graphs)`."""

    def __init__(self, eager: Any, names: tuple[str, ...]):
        self.eager, self.names = eager, tuple(names)
        net: nn.Module = eager.net
        self.modules = {n: net.get_submodule(n) for n in self.names}
        self._active: dict[str, _ModuleGraph] | None = None
        # a list while `bench step` measures the captured share: (start, end) CUDA events of every replay
        self.timings: list[tuple[torch.cuda.Event, torch.cuda.Event]] | None = None
        for name, module in self.modules.items():
            module.forward = self._forward_for(name, module.forward)  # instance attribute: nn.Module.__call__ calls it

    def _forward_for(self, name: str, original: Any) -> Any:
        def forward(x: torch.Tensor) -> Any:
            g = self._active.get(name) if self._active is not None else None
            if g is None or x.shape != g.x.shape or x.dtype != g.x.dtype or (x.requires_grad and g.grad_x is None):
                return original(x)
            return _Replay.apply(g, x, g.anchor)

        return forward

    @contextlib.contextmanager
    def active(self, graphs: CapturedParts) -> Iterator[None]:
        self._active = graphs
        try:
            yield
        finally:
            self._active = None

    def _input_shapes(self, img: torch.Tensor) -> dict[str, torch.Tensor]:
        """A no-grad eval-mode forward with hooks: the input each named module receives (shape, dtype, strides;
        under the key "" the train net's own input, so a module fed the network input is known)."""
        seen: dict[str, torch.Tensor] = {}
        net = self.eager.net
        hooks = [
            m.register_forward_pre_hook(lambda _m, args, n=n: seen.setdefault(n, args[0]))
            for n, m in [("", net), *self.modules.items()]
        ]
        was = net.training
        try:
            net.eval()
            with torch.no_grad():
                self.eager.forward(img)
        finally:
            net.train(was)
            for h in hooks:
                h.remove()
        missing = set(self.names) - set(seen) - {""}
        if missing:
            raise RuntimeError(f"capture plan names {sorted(missing)}, which the forward never called")
        return seen

    def capture(self, img: torch.Tensor, pool: tuple[int, int]) -> CapturedParts:
        """Every named module's forward and backward graphs, in the memory pool `pool` (the runner's, which it gives
        back when it drops these graphs)."""
        e = self.eager
        flat = e.flat
        samples = self._input_shapes(img)
        out: dict[str, _ModuleGraph] = {}
        for name, module in self.modules.items():
            s = samples[name]
            # the network input (images) never needs a gradient: capturing one would add a backward-data pass of the
            # first layer that no training step ran, and cuDNN's autotuning of it cannot run inside a capture
            x_grad = s is not samples[""]
            g = _ModuleGraph(
                torch.empty_strided(s.shape, s.stride(), dtype=s.dtype, device=s.device).requires_grad_(x_grad)
            )
            with torch.no_grad():
                g.x.copy_(s)
            prefix = name + "."
            own = {n[len(prefix) :]: p for n, p in flat.proxies.items() if n.startswith(prefix)}
            if not own:
                raise RuntimeError(f"capture plan names {name}, which has no trainable parameters")
            g.anchor = next(iter(own.values()))
            g.name, g.owner = name, self
            unpatched = _Unpatched(module, type(module).forward)  # its instance forward is the replaying one
            params = {"m." + k: v for k, v in own.items()}
            wrt = [g.x, *own.values()] if x_grad else list(own.values())

            # one warm-up of exactly what is captured, on a side stream (PyTorch's rule for capture): cuDNN autotunes
            # and lazy state initialises here, not inside the capture; its gradients are discarded and the buffers
            # it updated (BatchNorm statistics) restored, so training sees only real steps
            saved = [b.detach().clone() for b in module.buffers()]
            with streams.on_warmup_stream(g.x.device):
                warm = self._forward(unpatched, params, g.x)
                warm = (warm,) if isinstance(warm, torch.Tensor) else tuple(warm)
                torch.autograd.grad(warm, wrt, [torch.zeros_like(o) for o in warm], allow_unused=True)
                del warm
                if saved:
                    with torch.no_grad():
                        torch._foreach_copy_(list(module.buffers()), saved)
            with streams.capture(g.fwd, pool=pool, capture_error_mode="thread_local"):
                res = self._forward(unpatched, params, g.x)
            g.single = isinstance(res, torch.Tensor)
            g.outs = (res,) if g.single else tuple(res)
            g.grad_outs = [torch.empty_like(o) for o in g.outs]
            with streams.capture(g.bwd, pool=pool, capture_error_mode="thread_local"):
                grads = torch.autograd.grad(g.outs, wrt, g.grad_outs, allow_unused=True)
                if x_grad:
                    g.grad_x = grads[0] if grads[0] is not None else torch.zeros_like(g.x)
                    grads = grads[1:]
                used = [(prefix + n, gr) for n, gr in zip(own, grads) if gr is not None]
                if used:
                    flat.accumulate([n for n, _ in used], [gr for _, gr in used])
            g.outs = tuple(o.detach() for o in g.outs)
            out[name] = g
        return out

    def _forward(self, unpatched: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor) -> Any:
        """The module's forward on the half-precision stand-ins, under the step's autocast (what is captured)."""
        e = self.eager
        with torch.autocast(
            "cuda", dtype=e.autocast_dtype or torch.float32, enabled=e.autocast_dtype is not None, cache_enabled=False
        ):
            return torch.func.functional_call(unpatched, params, (x,))


class _Unpatched(nn.Module):
    """Calls a module's class-level forward (bypassing the replaying instance attribute) for the capture."""

    def __init__(self, module: nn.Module, forward: Any):
        super().__init__()
        self.m, self._fwd = module, forward

    def forward(self, x: torch.Tensor) -> Any:
        return self._fwd(self.m, x)
