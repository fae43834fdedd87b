"""Elastic restarts on CPU with Gloo (distributed/elastic.py): under `torchrun --max-restarts=1` a worker killed
mid-epoch makes torchrun restart the group, and the restarted workers continue the run from its last.pt in the same
folder: one folder, no duplicate results.csv row, and the final weights of a run that was never killed. One node
(`--standalone`). Two "nodes" on this machine (two agents meeting through the c10d rendezvous) are not tested: with
torch 2.14.1 even a script of bare Gloo all-reduces was never restarted there (both agents hung after the kill;
docs/multi-gpu.md)."""

import csv
import os
import subprocess
import sys
import textwrap

import torch

from libreyolo.engine.checkpoint import load_checkpoint
from libreyolo.events import read_events

SCRIPT = """
import os, signal, sys
import torch
from libreyolo import LibreYOLO
from libreyolo.families.yolo9.network import TrainNet

if __name__ == "__main__":
    data, project, kill_rank, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    m = LibreYOLO("LibreYOLO9t")
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and int(os.environ["RANK"]) == kill_rank:
        calls = [0]

        def pre_hook(module, args):
            # the kill_at-th training forward of the network: a step inside an epoch, after an epoch's last.pt
            if type(module) is TrainNet and module.training and torch.is_grad_enabled():
                calls[0] += 1
                if calls[0] == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)

        torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
    m.train(data=data, project=project, epochs=3, imgsz=64, batch=4, workers=0, device="cpu", seed=0)
"""


def _torchrun(tmp_path, data, project, kill_rank: int) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    # 16 images, global batch 4 over 2 ranks: 4 steps an epoch; the 6th forward is epoch 2's second step
    argv = [str(script), str(data), str(project), str(kill_rank), "6"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--max-restarts=1", "--monitor-interval=0.5", "--standalone"]
    r = subprocess.run([*cmd, "--nproc-per-node=2", *argv], env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


def _untimed(path):
    return [{k: v for k, v in row.items() if k.strip() != "time"} for row in csv.DictReader(open(path))]


def test_a_worker_killed_mid_epoch_restarts_the_group_and_the_run_continues_in_its_folder(tiny_data, tmp_path):
    _torchrun(tmp_path, tiny_data, tmp_path / "whole", kill_rank=-1)  # never killed
    _torchrun(tmp_path, tiny_data, tmp_path / "killed", kill_rank=1)
    assert [p.name for p in (tmp_path / "killed").iterdir()] == ["exp"]  # the restart did not start exp2
    run = tmp_path / "killed" / "exp"
    events = list(read_events(run / "events.jsonl"))
    starts = [e for e in events if e["type"] == "run_start"]
    assert [(e["resumed"], e["world_size"]) for e in starts] == [(False, 2), (True, 2)]
    assert [e["status"] for e in events if e["type"] == "run_end"] == ["finished"]  # the killed attempt wrote none
    assert any("torchrun restarted the job (attempt 2): resuming its run" in e.get("message", "") for e in events)
    rows, whole = _untimed(run / "results.csv"), _untimed(tmp_path / "whole" / "exp" / "results.csv")
    assert [r["epoch"].strip() for r in rows] == ["1", "2", "3"] and rows == whole
    a = load_checkpoint(tmp_path / "whole" / "exp" / "weights" / "last.pt")
    b = load_checkpoint(run / "weights" / "last.pt")
    assert b["epoch"] == 3
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=0, msg=k)
