"""DDP numerics with 2 Gloo CPU processes: after an optimizer step both ranks hold identical weights, and
2 ranks at per-rank batch b make the same update as 1 process at batch 2b, both through torch's DDP wrapper (eager
runs) and through flat gradients averaged by one all-reduce (what the CUDA-graph runners capture under NCCL).

Why the update is the same (the loss, families/yolo9/loss.py, is L = batch_scale * S / T with S the summed
per-anchor terms and T the batch's total target score): one process at batch B = N*b descends
B/T * grad(S). Rank r computes L_r = B * S_r / mean_r(T_r) = B*N/T * S_r (global batch as batch_scale,
normaliser averaged over ranks), and DDP averages gradients: 1/N * sum_r B*N/T * grad(S_r) = B/T * grad(S).

BatchNorm: in training mode BatchNorm normalises with statistics of the images it sees, b per rank against
2b in one process, so the forward itself differs; SyncBatchNorm, which shares them, runs on GPUs only. On CPU
the test therefore puts BatchNorm layers in eval mode (fixed running statistics), which makes every image's
forward independent of its batch-mates, and checks everything else: DDP's gradient average, the normaliser
reduction, the global-batch loss scale, and gradient accumulation (two micro-batches, the first inside DDP's
no_sync window). On 2 GPUs (marked gpu) BatchNorm stays in training mode and the DDP side is converted to
SyncBatchNorm, as the trainer does. A naive setup (per-rank normaliser, per-rank batch scale) is run too,
to show that the comparison can tell the difference."""

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

from libreyolo.config import TrainConfig
from libreyolo.data.config import list_images, load_data_config
from libreyolo.data.dataset import YOLODataset, collate
from libreyolo.data.labels import scan_labels
from libreyolo.distributed import context
from libreyolo.engine.flat import FlatParams
from libreyolo.engine.step import EagerStep
from libreyolo.families import get_family
from libreyolo.launch import free_port

B = 2  # per-rank batch; the reference process trains at 2 * B
WORLD = 2


def _micro_batches(data_yaml: str, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Two global micro-batches of 2*B real images with their boxes (different box counts per rank)."""
    data = load_data_config(data_yaml)
    ds = YOLODataset(scan_labels(list_images(data.train), data.nc), 64, augment=False)
    out = []
    for k in range(2):
        batch = collate([ds[i] for i in range(k * 2 * B, (k + 1) * 2 * B)])
        out.append(
            (batch["img"].to(device), batch["targets"].to(device), batch["mask"].to(device))
        )  # uint8, as the loop passes it
    return out


def _model(
    nc: int, device: torch.device, ctx: context.DistContext | None = None
) -> tuple[nn.Module, nn.Module, TrainConfig]:
    """The tiny YOLOv9 at a fixed init. On CPU BatchNorm is frozen (module docstring); on CUDA the DDP copies
    (ctx given) get SyncBatchNorm through the trainer's own conversion."""
    torch.manual_seed(0)
    family = get_family("yolo9")
    cfg = TrainConfig.from_overrides({}, family=family)  # the family's keys (aux, loss gains) with their defaults
    net = family.build("t", nc)
    train_net = family.train_net(net, cfg).to(device).train()
    if device.type == "cpu":
        for m in train_net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.eval()
    elif ctx is not None:
        train_net = context.sync_batchnorm(train_net, ctx, device, True, B, [])
        assert any(isinstance(m, nn.SyncBatchNorm) for m in train_net.modules())
    return net, train_net, cfg


def _step(
    train_net: nn.Module,
    step_net: nn.Module,
    loss_fn,
    batch_scale: float,
    micro,
    rank: int | None,
    grad_reduce=None,
) -> dict[str, torch.Tensor]:
    """One optimizer step over two micro-batches (accumulation); rank None trains on the whole global batch.
    grad_reduce given: flat gradient storage and that all-reduce instead of DDP's wrapper (the graph runners' way)."""
    before = {k: v.detach().clone() for k, v in train_net.named_parameters()}
    flat = FlatParams(train_net, None) if grad_reduce is not None else None
    opt = torch.optim.SGD([p for p in train_net.parameters() if p.requires_grad], lr=0.05, momentum=0.0)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    step = EagerStep(step_net, loss_fn, opt, scaler, None, None, 0.0, batch_scale, flat=flat)
    step.grad_reduce = grad_reduce
    for k, (x, t, m) in enumerate(micro):
        sl = slice(None) if rank is None else slice(rank * B, (rank + 1) * B)
        step(x[sl], t[sl], m[sl], boundary=k == len(micro) - 1)
    return {k: v.detach() - before[k] for k, v in train_net.named_parameters() if v.requires_grad}


def _rank_main(rank: int, port: int, data_yaml: str, spec: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False  # compare float32 with float32
    device, ctx = context.start(spec)  # the trainer's own process-group setup
    assert (ctx.backend, ctx.world_size, ctx.rank) == ("gloo" if spec == "cpu" else "nccl", WORLD, rank)
    micro = _micro_batches(data_yaml, device)
    family = get_family("yolo9")

    # reference: one process, the whole global batch, no collectives
    net, train_net, cfg = _model(3, device)
    ref = _step(train_net, train_net, family.loss(net, cfg), float(2 * B), micro, None)

    # what the trainer builds under DDP: wrapped module, normaliser averaged over ranks, global batch scale
    net, train_net, cfg = _model(3, device, ctx)
    ddp = _step(
        train_net,
        ctx.wrap(train_net, device),
        family.loss(net, cfg, ctx.normalizer_reducer()),
        float(2 * B),
        micro,
        rank,
    )

    # what the CUDA-graph runners build under DDP: no wrapper, flat gradients, one all-reduce of the flat buffer
    net_f, train_net_f, _ = _model(3, device, ctx)
    flat_upd = _step(
        train_net_f,
        train_net_f,
        family.loss(net_f, cfg, ctx.normalizer_reducer()),
        float(2 * B),
        micro,
        rank,
        grad_reduce=ctx.grad_reducer(),
    )

    # the naive setup: each rank normalises by its own targets and scales by its own batch
    net_n, train_net_n, _ = _model(3, device, ctx)
    naive = _step(train_net_n, ctx.wrap(train_net_n, device), family.loss(net_n, cfg), float(B), micro, rank)

    scale = max(v.abs().max().item() for v in ref.values())
    assert scale > 1e-4, "the step did not move the weights; the comparison would be empty"
    worst = max((ddp[k] - ref[k]).abs().max().item() for k in ref)
    assert worst <= 1e-4 * scale, (
        f"rank {rank}: DDP update differs from the single-process update by {worst:.3g} (update scale {scale:.3g})"
    )
    worst_flat = max((flat_upd[k] - ref[k]).abs().max().item() for k in ref)
    assert worst_flat <= 1e-4 * scale, (
        f"rank {rank}: the flat all-reduce update differs from the single-process one by {worst_flat:.3g}"
    )
    naive_gap = max((naive[k] - ref[k]).abs().max().item() for k in ref)
    assert naive_gap > 1e-2 * scale, f"the naive setup matched too ({naive_gap:.3g}): the test cannot tell them apart"

    # identical weights on every rank, bit for bit
    flat = torch.cat([p.detach().flatten() for p in train_net.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(WORLD)]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(gathered[0], g) for g in gathered), f"rank {rank}: weights differ across ranks after a step"
    ctx.finish()
    ctx.close()


def test_two_ranks_at_b_make_the_update_of_one_process_at_2b(tiny_data):
    torch.multiprocessing.spawn(_rank_main, args=(free_port(), str(tiny_data), "cpu"), nprocs=WORLD, join=True)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_with_syncbn_make_the_update_of_one_gpu_at_2b(tiny_data):
    torch.multiprocessing.spawn(_rank_main, args=(free_port(), str(tiny_data), "0,1"), nprocs=WORLD, join=True)
