"""The optimizer step, loss-scaler update and EMA update with no host synchronisation, for whole-step capture.

torch.optim.SGD has no capturable mode: its foreach path reads the learning rate and momentum as Python
numbers, which a CUDA graph would freeze at capture time, and GradScaler.step() reads found_inf with
.item(). Here every hyperparameter that changes during training (per-group LR, momentum/beta1, the EMA
decay) is a device tensor refreshed before each replay, and a non-finite gradient skips the update on the
device (keep = 0) instead of branching on the host. Gradients live in one flat buffer (engine/flat.py) so
unscale, sanitise and clip are a handful of kernels. The math is torch's SGD(nesterov)/AdamW and GradScaler's; the
state tensors are the optimizer's own, so checkpoints are interchangeable with the eager path
(tests/test_graphs.py checks both against torch.optim on the CPU)."""

from __future__ import annotations

from typing import Any

import torch

from libreyolo.engine.ema import ModelEMA
from libreyolo.engine.flat import FlatParams
from libreyolo.engine.step import EagerStep, TrainCounters


class CapturableUpdate:
    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        name: str,
        scaler: torch.amp.GradScaler,
        ema: ModelEMA | None,
        grad_clip: float,
        flat: FlatParams,
        device: torch.device,
    ):
        self.opt, self.name, self.scaler, self.ema, self.grad_clip, self.flat = (
            optimizer,
            name,
            scaler,
            ema,
            grad_clip,
            flat,
        )
        n = len(self.groups)
        # hyper = [lr_0 .. lr_{n-1}, momentum (SGD) / beta1 (AdamW)], written from pinned memory before a replay
        self.hyper = torch.zeros(n + 1, device=device)
        self.found_inf = torch.zeros(1, device=device)
        self.skipped = torch.zeros((), device=device, dtype=torch.int32)
        self.ema_updates = torch.zeros((), device=device)
        self.steps = [torch.zeros((), device=device) for _ in range(n)]
        if scaler.is_enabled():
            scaler.scale(torch.zeros((), device=device))  # creates the scale/growth tensors the graph updates
        for g in self.groups:
            for p in g["params"]:
                st = self.opt.state[p]
                if self.name == "SGD":
                    st.setdefault("momentum_buffer", torch.zeros_like(p))
                else:
                    st.setdefault("exp_avg", torch.zeros_like(p))
                    st.setdefault("exp_avg_sq", torch.zeros_like(p))
        self.reload()

    @property
    def groups(self) -> list[dict[str, Any]]:
        """The optimizer's groups as they are now: a resume's load_state_dict replaces the group dicts, and
        the schedule writes the LR into the new ones."""
        return [g for g in self.opt.param_groups if g["params"]]

    def reload(self) -> None:
        """Take the host-side counters (EMA updates, AdamW step per group) into the device ones: at
        construction and after a resume has loaded the optimizer and the EMA. In place, as a captured
        graph holds these tensors."""
        self.ema_updates.fill_(float(self.ema.updates if self.ema else 0))
        if self.name == "AdamW":
            for j, g in enumerate(self.groups):
                self.steps[j].fill_(float(self.opt.state[g["params"][0]].get("step", torch.zeros(())).item()))

    def load_hyper(self) -> None:
        """Copy this step's LR per group and momentum (set by the schedule in param_groups) to the device."""
        mom = self.groups[0].get("momentum", self.groups[0].get("betas", (0.0,))[0])
        host = torch.tensor([g["lr"] for g in self.groups] + [mom], dtype=torch.float32)
        if self.hyper.is_cuda:
            host = host.pin_memory()  # the caching host allocator keeps it alive until the copy has run
        self.hyper.copy_(host, non_blocking=True)

    # --- the captured part --------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> None:
        """Unscale, skip-on-inf, clip, update, zero the gradients, update the scaler and the EMA."""
        flat = self.flat.flat_grad
        if self.scaler.is_enabled():
            scale, _ = self._scaler_tensors()
            self.found_inf.zero_()
            torch._amp_foreach_non_finite_check_and_unscale_(
                [flat], self.found_inf, scale.double().reciprocal().float()
            )
            keep = 1.0 - self.found_inf[0]
            flat.nan_to_num_(0.0, 0.0, 0.0).mul_(keep)
        else:
            keep = torch.ones((), device=flat.device)
        if self.grad_clip > 0:
            self.flat.clip_grad_norm_(self.grad_clip)
        if self.name == "SGD":
            self._sgd(keep)
        else:
            self._adamw(keep)
        flat.zero_()
        self.flat.refresh()
        if self.scaler.is_enabled():
            self.skipped += self.found_inf[0].to(torch.int32)
            scale, tracker = self._scaler_tensors()
            torch._amp_update_scale_(
                scale,
                tracker,
                self.found_inf,
                self.scaler._growth_factor,
                self.scaler._backoff_factor,
                self.scaler._growth_interval,
            )
        if self.ema is not None:
            self._ema()

    def _sgd(self, keep: torch.Tensor) -> None:
        m = self.hyper[-1]
        mfac = 1.0 + keep * (m - 1.0)  # momentum decay only on a real step
        for j, g in enumerate(self.groups):
            params = g["params"]
            grads = [p.grad for p in params]
            bufs = [self.opt.state[p]["momentum_buffer"] for p in params]
            if g["weight_decay"]:
                torch._foreach_add_(grads, torch._foreach_mul(params, keep), alpha=g["weight_decay"])
            torch._foreach_mul_(bufs, mfac)
            torch._foreach_add_(bufs, grads)
            upd = torch._foreach_add(grads, torch._foreach_mul(bufs, m)) if g.get("nesterov") else bufs
            torch._foreach_sub_(params, torch._foreach_mul(upd, self.hyper[j] * keep))

    def _adamw(self, keep: torch.Tensor) -> None:
        b1 = self.hyper[-1]
        for j, g in enumerate(self.groups):
            b2, eps, wd = g["betas"][1], g["eps"], g["weight_decay"]
            params = g["params"]
            grads = [p.grad for p in params]
            m1 = [self.opt.state[p]["exp_avg"] for p in params]
            m2 = [self.opt.state[p]["exp_avg_sq"] for p in params]
            lr = self.hyper[j]
            step = self.steps[j].add_(keep)
            if wd:
                torch._foreach_mul_(params, 1.0 - lr * wd * keep)
            # exp_avg.lerp_(grad, 1 - beta1) and exp_avg_sq = b2*exp_avg_sq + (1-b2)*g^2, both frozen when keep = 0
            diff = torch._foreach_sub(grads, m1)
            torch._foreach_mul_(diff, keep * (1.0 - b1))
            torch._foreach_add_(m1, diff)
            torch._foreach_mul_(m2, 1.0 - keep * (1.0 - b2))
            torch._foreach_addcmul_(m2, grads, grads, value=1.0 - b2)
            # a skipped first step leaves step at 0: bias corrections of 0 would turn the zero update into NaN
            t = step.clamp(min=1.0)
            bias1 = 1.0 - torch.pow(b1, t)
            bias2_sqrt = torch.sqrt(1.0 - torch.pow(torch.full_like(b1, b2), t))
            denom = torch._foreach_sqrt(m2)
            torch._foreach_mul_(denom, 1.0 / bias2_sqrt)
            torch._foreach_add_(denom, eps)
            upd = torch._foreach_div(m1, denom)
            torch._foreach_mul_(upd, keep * lr / bias1)
            torch._foreach_sub_(params, upd)

    def _scaler_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The scaler's scale and growth tracker (made in __init__ for an enabled scaler)."""
        scale, tracker = self.scaler._scale, self.scaler._growth_tracker
        assert scale is not None and tracker is not None
        return scale, tracker

    def _ema(self) -> None:
        e = self.ema
        assert e is not None
        self.ema_updates += 1.0
        d = e.decay * (1.0 - torch.exp(-self.ema_updates / e.tau))
        torch._foreach_mul_(e._ema_t, d)
        torch._foreach_add_(e._ema_t, torch._foreach_mul(e._src_t, 1.0 - d))

    # --- host side ----------------------------------------------------------------------------------
    def hand_back(self, eager: EagerStep) -> None:
        """A step-down from the whole-step graph: torch's optimizer and the EMA update from here on, so their own
        counters take the device ones (the EMA's update count, AdamW's step per group; fused optimizers keep the
        step on the parameter's device), and eager's skipped-step count takes this epoch's so far."""
        if self.ema is not None:
            self.ema.updates = int(self.ema_updates.item())
        if self.name == "AdamW":
            fused = bool(self.opt.defaults.get("fused"))
            for step, g in zip(self.steps, self.groups):
                for p in g["params"]:
                    self.opt.state[p]["step"] = step.detach().clone().to(p.device if fused else "cpu")
        eager.skipped = self.skipped.clone()

    def train_counters(self) -> TrainCounters:
        """optimizer.state_dict() with each AdamW step the device counter of its group, and the EMA's update count
        as that device counter: tensors that the checkpoint's snapshot copies behind the queued steps, where reading
        them here would wait for those steps (the host-side counters are not kept current). The state dict's
        per-parameter entries are new dicts: the optimizer's own state is left as it is."""
        state = self.opt.state_dict()
        if self.name == "AdamW":
            groups = [g for g in state["param_groups"] if g["params"]]  # as self.groups: the ones with parameters
            for step, g in zip(self.steps, groups):
                for i in g["params"]:
                    state["state"][i] = {**state["state"][i], "step": step}
        return TrainCounters(state, self.ema_updates if self.ema is not None else None)
