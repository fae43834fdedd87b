"""Elastic restarts on CPU with Gloo (distributed/elastic.py): under `torchrun --max-restarts=1` a worker killed
mid-epoch makes torchrun restart the group, and the restarted workers continue the run from its last.pt in the same
folder: one folder, no duplicate results.csv row, and the final weights of a run that was never killed. One node
(`--standalone`), and two "nodes" on this machine: two agents meeting through the c10d rendezvous, where the surviving
agent restarts its healthy worker for the membership change without counting a restart."""

import csv
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

from libreyolo.engine.checkpoint import load_checkpoint
from libreyolo.events import read_events

SCRIPT = """
import os, signal, sys, time
from pathlib import Path
import torch
from libreyolo import LibreYOLO
from libreyolo.families.yolo9.network import TrainNet

if __name__ == "__main__":
    data, project, kill_rank, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    # the first attempt only: a file, as TORCHELASTIC_RESTART_COUNT stays 0 where an agent restarted healthy workers
    killed = Path(project + ".killed")
    with open(project + ".starts", "a") as f:  # one line a worker: its rank and its agent's restart count
        f.write(f"{os.environ['RANK']} {os.environ['TORCHELASTIC_RESTART_COUNT']}\\n")
    m = LibreYOLO("LibreYOLO9t")
    if kill_rank >= 0 and not killed.exists():
        calls = [0]

        def pre_hook(module, args):
            # the kill_at-th training forward of the network: a step inside an epoch, after an epoch's last.pt
            if type(module) is TrainNet and module.training and torch.is_grad_enabled():
                calls[0] += 1
                if calls[0] == kill_at and int(os.environ["RANK"]) == kill_rank:
                    killed.touch()
                    os.kill(os.getpid(), signal.SIGKILL)
                if calls[0] == kill_at:  # the others are inside a long step (or a validation) when it dies: their
                    time.sleep(30)  # agent ends them, before any collective finds the peer gone

        torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
    m.train(data=data, project=project, epochs=3, imgsz=64, batch=4, workers=0, device="cpu", seed=0)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(tmp_path, data, project, kill_rank: int, agents: int = 1) -> None:
    """One torchrun job of 2 workers: one agent of 2 (`--standalone`), or 2 agents of 1 that meet through the c10d
    rendezvous as two nodes would; every agent must exit 0."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    # 16 images, global batch 4 over 2 ranks: 4 steps an epoch; the 6th forward is epoch 2's second step
    argv = [str(script), str(data), str(project), str(kill_rank), "6"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--max-restarts=1", "--monitor-interval=0.5"]
    if agents == 1:
        cmd += ["--standalone", "--nproc-per-node=2"]
    else:
        rdzv = [f"--rdzv-endpoint=127.0.0.1:{_free_port()}", f"--rdzv-id={project.name}-{os.getpid()}"]
        cmd += [f"--nnodes={agents}", "--nproc-per-node=1", "--rdzv-backend=c10d", *rdzv]
    procs = [
        subprocess.Popen([*cmd, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(agents)
    ]
    try:
        outs = [p.communicate(timeout=400)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)


def _untimed(path):
    return [{k: v for k, v in row.items() if k.strip() != "time"} for row in csv.DictReader(open(path))]


@pytest.fixture(scope="module")
def whole(tiny_data, tmp_path_factory):
    """The run never killed (one node): every restarted run below must end where it ends."""
    tmp = tmp_path_factory.mktemp("whole")
    _torchrun(tmp, tiny_data, tmp / "whole", kill_rank=-1)
    return tmp / "whole" / "exp"


def _continued_in_its_folder(project, whole) -> list[int]:
    """The killed job's one run folder: its results.csv rows and final weights are the uninterrupted run's; each rank
    started twice (the restart the kill asked for, none spent on a group that failed to start).
    -> every worker's TORCHELASTIC_RESTART_COUNT, sorted."""
    starts = [line.split() for line in open(f"{project}.starts").read().splitlines()]
    assert sorted(rank for rank, _ in starts) == ["0", "0", "1", "1"], starts
    assert [p.name for p in project.iterdir()] == ["exp"]  # the restart did not start exp2
    run = project / "exp"
    events = list(read_events(run / "events.jsonl"))
    run_starts = [e for e in events if e["type"] == "run_start"]
    assert [(e["resumed"], e["world_size"]) for e in run_starts] == [(False, 2), (True, 2)]
    assert any("torchrun restarted the job (attempt 2): resuming its run" in e.get("message", "") for e in events)
    rows = _untimed(run / "results.csv")
    assert [r["epoch"].strip() for r in rows] == ["1", "2", "3"] and rows == _untimed(whole / "results.csv")
    a = load_checkpoint(whole / "weights" / "last.pt")
    b = load_checkpoint(run / "weights" / "last.pt")
    assert b["epoch"] == 3
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=0, msg=k)
    assert [e["status"] for e in events if e["type"] == "run_end"] == ["finished"]  # the killed attempt wrote none
    return sorted(int(count) for _, count in starts)


def test_a_worker_killed_mid_epoch_restarts_the_group_and_the_run_continues_in_its_folder(tiny_data, tmp_path, whole):
    _torchrun(tmp_path, tiny_data, tmp_path / "killed", kill_rank=1)
    assert _continued_in_its_folder(tmp_path / "killed", whole) == [0, 0, 1, 1]


def test_two_agents_restart_after_a_worker_is_killed_and_the_run_continues_in_its_folder(tiny_data, tmp_path, whole):
    _torchrun(tmp_path, tiny_data, tmp_path / "killed", kill_rank=1, agents=2)
    # the case this test is about (torch 2.14.1): the killed worker's agent restarts its group as attempt 1; the other
    # agent restarts its healthy worker for the membership change and still tells it 0. The workers must agree that
    # this is a restart anyway, and key the new process group apart from the dead one's addresses in the agent's store
    assert _continued_in_its_folder(tmp_path / "killed", whole) == [0, 0, 0, 1]
