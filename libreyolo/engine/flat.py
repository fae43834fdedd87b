"""Flat parameter storage for training: fewer kernels per step with the same arithmetic as autocast.

Under autocast every convolution casts its fp32 weight (and bias) to fp16 on every forward, casts their
gradients back on every backward, and every micro-batch of gradient accumulation adds each gradient into
.grad: about 1,300 small kernels per YOLOv9-t step. Here instead
- the fp32 master parameters live in one flat buffer, their .grad are views of one flat gradient buffer;
- the forward runs on stand-in leaves, swapped into the modules' parameter slots for the call (what
  torch.func.functional_call does, without its per-call name resolution): fp16/bf16 copies of the
  convolution weights and biases (one buffer, refreshed by ONE copy kernel after each optimizer step), and aliases
  of the other (fp32) parameters;
- after each backward the stand-ins' gradients are added into the flat gradient buffer by two multi-tensor
  (foreach) calls: the half gradients are copied into a flat half buffer laid out like the stand-ins and added
  to the fp32 range in one kernel, the fp32 ones are added to their masters' gradient views (a handful of
  kernels instead of one add per parameter, and no per-parameter Python).
Rounding is the same as autocast's (fp32 -> half weight casts, half gradients accumulated in fp32), so the
optimizer, the EMA, checkpoints and the state dict all still see ordinary fp32 parameters."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

ALIGN = 128  # elements: 256 bytes in half precision, 512 in float32


class FlatParams:
    def __init__(self, module: nn.Module, half: torch.dtype | None, channels_last: bool = False):
        self.module = module
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        # half-precision candidates first, so their masters are one contiguous range: convolution kernels and
        # biases, which autocast casts for every convolution (a bias of a layer autocast runs in float32 stays fp32)
        conv_bias = {
            id(m.bias) for m in module.modules() if isinstance(m, nn.modules.conv._ConvNd) and m.bias is not None
        }
        is_half = [half is not None and (p.dim() == 4 or id(p) in conv_bias) for _, p in named]
        order = sorted(range(len(named)), key=lambda i: not is_half[i])
        self.names = [named[i][0] for i in order]
        self.params = [named[i][1] for i in order]
        self.n_half_params = sum(is_half)
        sizes = [p.numel() for p in self.params]
        # every tensor starts on an ALIGN-element boundary: cuDNN's vectorised kernels fault on misaligned views
        offsets, off = [], 0
        for n in sizes:
            offsets.append(off)
            off += -(-n // ALIGN) * ALIGN
        total = off
        self.n_half = offsets[self.n_half_params] if self.n_half_params < len(sizes) else total
        dev = self.params[0].device
        self.flat = torch.zeros(total, device=dev, dtype=torch.float32)
        self.flat_grad = torch.zeros_like(self.flat)
        self.flat_half = torch.zeros(self.n_half, device=dev, dtype=half or torch.float32)
        # the stand-ins' half gradients land here (the alignment gaps stay zero), then go into flat_grad in one add
        self.flat_half_grad = torch.zeros_like(self.flat_half)
        self._half_grad_views: list[torch.Tensor] = []
        self._full_grad_views: list[torch.Tensor] = []
        self.proxies: dict[str, torch.Tensor] = {}
        for k, (name, p, off) in enumerate(zip(self.names, self.params, offsets)):
            cl = channels_last and p.dim() == 4
            view = _view(self.flat, off, p.shape, cl)
            view.copy_(p.detach())
            p.data = view
            p.grad = _view(self.flat_grad, off, p.shape, cl)
            if k < self.n_half_params:
                proxy = _view(self.flat_half, off, p.shape, cl)
                self._half_grad_views.append(_view(self.flat_half_grad, off, p.shape, cl))
            else:
                proxy = p.detach()  # same storage as the master: nothing to refresh
                self._full_grad_views.append(p.grad)
            self.proxies[name] = proxy.requires_grad_(True)
        self._half_proxies = [self.proxies[n] for n in self.names[: self.n_half_params]]
        self._full_proxies = [self.proxies[n] for n in self.names[self.n_half_params :]]
        self._slots = _slots(module, {id(p): self.proxies[n] for n, p in zip(self.names, self.params)})
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the fp32 masters of the convolution kernels and biases into their half-precision stand-ins."""
        if self.n_half:
            self.flat_half.copy_(self.flat[: self.n_half])

    def forward(self, *args: Any) -> Any:
        """module(*args) with the stand-ins in place of the parameters, as torch.func.functional_call(module,
        proxies, args) computes it. functional_call resolves every dotted name through the module tree and checks
        for tied weights on each call (about 10 ms of host time per step for YOLOv9-t's 738 parameters); the
        parameter slots here were resolved once, so a call is two passes of dictionary stores."""
        slots = self._slots
        saved = [d[k] for d, k, _ in slots]
        for d, k, proxy in slots:
            d[k] = proxy
        try:
            return self.module(*args)
        finally:
            for (d, k, _), orig in zip(slots, saved):
                d[k] = orig

    @torch.no_grad()
    def gather_grads(self) -> None:
        """Add the stand-ins' gradients into the flat fp32 gradient buffer and release them. The gradients have
        their stand-ins' strides (autograd's layout contract), so the multi-tensor calls take their fast path."""
        if self._half_proxies:
            torch._foreach_copy_(self._half_grad_views, _take_grads(self._half_proxies))
            self.flat_grad[: self.n_half].add_(self.flat_half_grad)
        if self._full_proxies:
            torch._foreach_add_(self._full_grad_views, _take_grads(self._full_proxies))

    @torch.no_grad()
    def accumulate(self, names: list[str], grads: list[torch.Tensor]) -> None:
        """Add gradients of the named parameters' stand-ins (computed elsewhere: a captured submodule's backward
        graph) into the flat fp32 gradient buffer."""
        masters = dict(zip(self.names, self.params))
        acc: list[torch.Tensor] = []
        for n in names:
            grad = masters[n].grad
            assert grad is not None  # a view into the flat gradient buffer, set at construction
            acc.append(grad)
        torch._foreach_add_(acc, [g.float() for g in grads])

    def zero_grad(self) -> None:
        self.flat_grad.zero_()

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """torch.nn.utils.clip_grad_norm_ semantics on the one flat buffer: two kernels, no host sync."""
        g = self.flat_grad
        # on a CPU, vector_norm over YOLOv9-t's 2.4M float32 gradients is off by ~1e-4 (relative; torch's per-tensor
        # norms and a float64 sum agree to 1e-7), where sum() adds in a cascade that stays exact to ~1e-7
        norm = torch.linalg.vector_norm(g) if g.device.type != "cpu" else g.square().sum().sqrt()
        g.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))
        return norm


def _slots(module: nn.Module, proxy_of: dict[int, torch.Tensor]) -> list[tuple[dict[str, Any], str, torch.Tensor]]:
    """Every (module._parameters, name) that holds one of the parameters, with that parameter's stand-in: shared
    submodules and tied parameters (one Parameter under several names) are covered, as functional_call unties them."""
    out, seen = [], set()
    for _, m in module.named_modules(remove_duplicate=False):
        d = m._parameters
        for k, v in d.items():
            if v is not None and id(v) in proxy_of and (id(d), k) not in seen:
                seen.add((id(d), k))
                out.append((d, k, proxy_of[id(v)]))
    return out


def _take_grads(proxies: list[torch.Tensor]) -> list[torch.Tensor]:
    """The stand-ins' gradients (zeros for one the forward did not use), leaving .grad empty for the next backward."""
    grads = [g if (g := p.grad) is not None else torch.zeros_like(p) for p in proxies]
    for p in proxies:
        p.grad = None
    return grads


def _view(flat: torch.Tensor, off: int, shape: torch.Size, channels_last: bool) -> torch.Tensor:
    n = shape.numel()
    chunk = flat[off : off + n]
    if channels_last:  # (N, C, H, W) with channels-last strides, as cuDNN wants for NHWC kernels
        N, C, H, W = shape
        return chunk.view(N, H, W, C).permute(0, 3, 1, 2)
    return chunk.view(shape)
