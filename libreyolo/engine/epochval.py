"""Each epoch's validation, off the training loop's path.

At an epoch's end the trainer starts its validation. On a GPU the validated weights are first copied (one queued
copy on the training stream) into a network of the validation's own, and the whole validation (forward, loss, NMS
and the COCO evaluation) runs on a thread with its own CUDA stream while the next epoch trains
(eval/threaded.py): the loop is held only for the copy. Elsewhere the device part holds the loop and only the
COCO evaluation runs on a background thread. When the evaluation lands (the trainer looks at every step event,
and waits for it at the next epoch's end at the latest), the epoch's `val` event and results.csv row are
written, best.pt is saved from the weights that were validated (the copy taken when validation started) if they
are the best, and early stopping is decided. The final epoch waits for its evaluation. Under DDP (rank 0
validates, every rank waits for the result, so that all agree on the best epoch and on early stopping at the
same point) and while profiling, validation is synchronous."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from libreyolo import events as ev
from libreyolo.config import resolve_multi_label
from libreyolo.data.dataset import capacity
from libreyolo.engine import passes
from libreyolo.engine.graphs import STABLE_AFTER
from libreyolo.eval.coco import EvalProcess, load_evaluator
from libreyolo.eval.graphed import EvalGraph
from libreyolo.eval.threaded import ThreadedValidation
from libreyolo.eval.validator import PendingValidation, to_input
from libreyolo.nn.clone import clone
from libreyolo.runs import append_results, results_columns, results_row
from libreyolo.tasks import get_task

if TYPE_CHECKING:
    from libreyolo.config import TrainConfig
    from libreyolo.engine.setup import TrainSetup

# The validation workers start decoding this many steps before an epoch ends, or earlier, VAL_HEAD_START_S before
# its end by the epoch's steady step time: with 26 ms steps (LibreYOLO9t, batch 16, whole-step graph on the
# H200) four steps gave seven workers 0.1 s for 200 images of 640 px, and validation waited for the rest.
VAL_PREFETCH_STEPS = 4
VAL_HEAD_START_S = 0.5


def val_prefetch_due(steps_left: int, step_s: float | None) -> bool:
    """Whether to start the validation workers' pass now, with steps_left steps (this one included) to go and
    step_s the steady seconds per step (None before it is known)."""
    return steps_left <= VAL_PREFETCH_STEPS or (step_s is not None and steps_left * step_s <= VAL_HEAD_START_S)


@dataclass
class _Pending:
    epoch: int
    validation: PendingValidation | ThreadedValidation
    train_losses: Callable[[], dict[str, float]]  # the epoch's mean training losses (read off the device when asked)
    lrs: dict[str, float]
    weights: dict[str, torch.Tensor]  # what was validated, for best.pt
    held_s: float  # how long starting it held the training loop


@dataclass(frozen=True)
class Landed:
    """A validation whose evaluation finished, as every rank learns it: the loop (engine/trainer.py) alone decides
    from it whether these weights are the best so far and whether to stop early."""

    epoch: int
    fitness: float
    metrics: dict[str, float]  # the task's metrics and "fitness"
    weights: dict[str, torch.Tensor] | None  # the weights validated (rank 0; None on the other ranks)


class EpochValidations:
    """What validation needs of the run is passed in, not the trainer: the setup, the config, where events and
    unreadable files go, and on_landed, which receives each finished validation (the loop judges it)."""

    def __init__(
        self,
        s: TrainSetup,
        cfg: TrainConfig,
        emit: Callable[[ev.Event], None],
        note_bad: Callable[[list[str]], None],
        on_landed: Callable[[Landed], None],
    ):
        self.s, self.cfg, self.emit, self.note_bad, self.on_landed = s, cfg, emit, note_bad, on_landed
        self.pending: _Pending | None = None
        self.fitness: dict[int, float] = {}  # epoch -> fitness, once landed
        self.task = get_task(s.family.task).implementation()  # the validation of the run's task
        self.source = s.kept_net  # what is validated: the EMA weights, if any
        # on a GPU the validation runs beside the next epoch's steps, which update the source in place: it reads a
        # copy of its own, refreshed at each validation's start; elsewhere it reads the source itself
        self.background = s.device.type == "cuda" and s.is_main and not self.synchronous
        # beside a GPU's steps the COCO evaluation runs in a child process: in this one it would hold the interpreter
        # lock that the loop needs to queue each step (eval/coco.py)
        self.eval_process = EvalProcess() if self.background else None
        if self.eval_process is not None:
            self.eval_process.start()  # forked before take_copy() waits for the warm-up, not beside the steps
        self.net = self.source
        if self.background:  # the kernel warm-up's copy of the detector, if any (one deep copy fewer)
            kept = s.kernel_warmup.take_copy() if s.kernel_warmup is not None else None
            self.net = kept if kept is not None else clone(self.source).eval().requires_grad_(False)
        self.stream = torch.cuda.Stream(s.device) if self.background else None
        # the validated network is updated in place: one graph serves every validation
        self.graph = None
        if s.val_graph:
            self.graph = EvalGraph(
                self.net,
                s.val_loss,
                s.amp.autocast_dtype,
                capacity(max(map(len, s.val_loader.dataset.labels.labels), default=0)),
            )
        self._told = False
        self.on_result: Callable[[int, dict[str, object]], None] | None = None  # each result (the plot writer)
        self.multi_label = resolve_multi_label(cfg.multi_label, "val")  # what the validations and the warm-up NMS with
        # steps until _warm_up() starts: once the training step's own graphs are captured (at the STABLE_AFTER-th
        # step, and its other micro/boundary variant within one accumulation window after it)
        warm = self.background and self.graph is not None and self.task.warm_validation
        self._warm_in: int | None = STABLE_AFTER + s.accumulate + 1 if warm else None
        self._warm: threading.Thread | None = None

    @property
    def synchronous(self) -> bool:
        """DDP: every rank takes part in the broadcast of the result, at the same point. profile=true: an
        evaluation running beside the profiled steps would take the interpreter lock and the CPU from them."""
        return self.s.world_size > 1 or self.cfg.profile

    def invalidate(self) -> None:
        if self.graph is not None:
            self.wait_device()  # not while a validation thread replays the graph
            self.graph.invalidate()

    def after_step(self) -> None:
        """Called after every training step: a few steps in, _warm_up() starts on its own thread."""
        if self._warm_in is not None:
            self._warm_in -= 1
            if self._warm_in <= 0:
                self._warm_in = None
                self._warm = threading.Thread(target=self._warm_up, name="libreyolo-val-warm", daemon=True)
                self._warm.start()

    def _warm_up(self) -> None:
        """What the first validation would otherwise do first, on a thread beside the first epoch's steps: capture
        the validation's graph (its warm-up pass builds cuDNN's plans in the capturing thread: 1.1-1.2 s on the
        H200), load the NMS kernels, import the COCO evaluator. The first validation then only replays; it used to
        capture, holding the validation loader so long that the second epoch's prefetch waited 0.5-0.6 s for it
        (docs/performance.md). The input is zeros of the validation batch's shape: the graph's weights are the
        validation network's own, refreshed in place before each validation. A failure is left to the first
        validation, which does the same work and reports it."""
        s, cfg = self.s, self.cfg
        try:
            assert self.graph is not None and self.stream is not None
            n, imgsz = s.val_loader.batch_size, (cfg.imgsz, cfg.imgsz)
            with torch.cuda.stream(self.stream):
                x = to_input(torch.zeros((n, *imgsz, 3), dtype=torch.uint8), s.device, cfg.channels_last)
                targets = torch.zeros((n, 1, 5), device=s.device)
                raw, _ = self.graph(x, targets, torch.zeros((n, 1), dtype=torch.bool, device=s.device), imgsz)
                s.family.postprocess(
                    self.net, raw, imgsz, conf=cfg.conf, iou=cfg.iou, max_det=cfg.max_det, multi_label=self.multi_label
                )
            load_evaluator()
        except Exception:  # noqa: BLE001,S110  (the first validation does the same and reports what fails)
            pass

    def _join_warm(self) -> None:
        warm, self._warm = self._warm, None
        if warm is not None:
            warm.join()

    def wait_device(self) -> None:
        """Until neither the warm-up nor the validation in flight (if any) uses the device, the loader or the graph."""
        self._join_warm()
        self._wait_validation()

    def close(self) -> None:
        """After wait_device() at the run's end: the evaluation's child process ends (a pending evaluation first)."""
        if self.eval_process is not None:
            self.eval_process.close()

    def _wait_validation(self) -> None:
        if self.pending is not None and isinstance(self.pending.validation, ThreadedValidation):
            self.pending.validation.wait_device()

    def due(self, epoch: int) -> bool:
        return passes.validation_due(self.cfg, epoch)

    def prefetch(self, epoch: int) -> None:
        """Start the validation workers' pass a few steps before the epoch ends (they decode meanwhile)."""
        s = self.s
        if s.is_main and self.due(epoch) and hasattr(s.val_loader, "prefetch"):
            # the previous validation's pass must be over (epochs shorter than a validation); the warm-up never
            # reads the loader: waiting for it here held the first epoch 0.4-0.5 s on the H200
            self._wait_validation()
            s.val_loader.prefetch()

    def start(self, epoch: int, train_losses: Callable[[], dict[str, float]], lrs: dict[str, float]) -> None:
        s, cfg = self.s, self.cfg
        self.settle(wait=True)  # at most one evaluation in flight
        self._join_warm()  # the graph is captured (or capturing it failed) before a validation uses it
        if self.due(epoch) and s.is_main:
            t0 = time.perf_counter()

            def run(background: bool) -> PendingValidation:
                return self.task.start_validation(
                    self.net,
                    s.family,
                    s.val_loader,
                    s.device,
                    s.names,
                    s.val_loss,
                    cfg.conf,
                    cfg.iou,
                    cfg.max_det,
                    s.amp.autocast_dtype,
                    cfg.channels_last,
                    background=background,
                    static_shape=self.graph is not None,
                    graph=self.graph,
                    multi_label=self.multi_label,
                    eval_process=self.eval_process,
                )

            v: PendingValidation | ThreadedValidation
            if self.background:
                assert self.stream is not None
                weights = self.net.state_dict()  # the copy: rewritten only at the next start, after this one landed
                with torch.no_grad():
                    torch._foreach_copy_(list(weights.values()), list(self.source.state_dict().values()))
                ready = torch.cuda.Event()
                ready.record()
                v = ThreadedValidation(lambda: run(background=False), self.stream, ready)
            else:
                weights = {k: t.detach().clone() for k, t in self.net.state_dict().items()}
                v = run(background=not self.synchronous)
            self.pending = _Pending(epoch, v, train_losses, lrs, weights, time.perf_counter() - t0)
        if self.synchronous and self.due(epoch):
            self.settle(wait=True)

    def settle(self, wait: bool) -> None:
        """Land the pending validation if its evaluation finished (or wait for it): on_landed gets it."""
        s = self.s
        p = self.pending
        if s.world_size > 1:
            if not wait:
                return
            self.pending = None
            landed = self._land(p) if p is not None else None
            epoch, fitness, metrics = s.dist.broadcast(landed or (None, None, {}))
            if epoch is not None and fitness is not None:
                self._landed(Landed(epoch, fitness, metrics, p.weights if p is not None else None))
            return
        if p is None or (not wait and not p.validation.done()):
            return
        self.pending = None
        epoch, fitness, metrics = self._land(p)
        self._landed(Landed(epoch, fitness, metrics, p.weights))

    def _landed(self, landed: Landed) -> None:
        self.fitness[landed.epoch] = landed.fitness
        self.on_landed(landed)

    def _land(self, p: _Pending) -> tuple[int, float, dict[str, float]]:
        """Rank 0: the val event and the results.csv row. -> (epoch, fitness, metrics)."""
        s = self.s
        v = p.validation.result()
        self.note_bad(v["bad"])
        if self.graph is not None and self.graph.error and not self._told:
            self._told = True
            why = f"validation runs eager: capturing its CUDA graph failed ({self.graph.error})"
            self.emit(ev.WarningEvent(why, code="val_graph"))
        task = get_task(s.family.task)
        metrics = {k: float(v[k]) for k in task.metric_names}
        fitness = task.fitness(metrics)
        # the per-class rows where a reader looks for them: a best so far of this process, and the final epoch
        rows = fitness > max(self.fitness.values(), default=-1.0) or p.epoch + 1 == self.cfg.epochs
        self.emit(
            ev.Val(
                epoch=p.epoch,
                metrics=metrics,
                losses=v["losses"],
                images=v["images"],
                time_s=v["time_s"],
                eval_s=v["eval_s"],
                held_s=p.held_s,
                per_class=v.get("per_class") if rows else None,
            )
        )
        metrics = {**metrics, "fitness": fitness}
        row = results_row(
            p.epoch + 1, time.time() - s.t_start, p.train_losses(), v, v["losses"], list(p.lrs.values()), task
        )
        append_results(s.run_dir / "results.csv", row, results_columns(s.family.loss_terms, len(p.lrs), task))
        if self.on_result is not None:
            self.on_result(p.epoch, v)
        return p.epoch, fitness, metrics
