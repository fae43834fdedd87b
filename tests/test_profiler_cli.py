"""`libreyolo profile run|summary|phases|kernels` from the command line."""

import json
import os
import subprocess
import sys

import pytest

from libreyolo.cli.main import main
from libreyolo.events import read_events
from libreyolo.profiler.schema import load_profile


@pytest.fixture(scope="module")
def repeated(tiny_data, tmp_path_factory):
    """Two profile-only trials of the tiny model, run as a user would: a subprocess, --json on stdout."""
    project = tmp_path_factory.mktemp("profile_cli")
    cmd = [
        sys.executable,
        "-m",
        "libreyolo.cli.main",
        "profile",
        "run",
        str(tiny_data),
        "--model",
        "LibreYOLO9t",
        "--batch",
        "4",
        "--imgsz",
        "64",
        "--workers",
        "0",
        "--device",
        "cpu",
        "--warmup",
        "1",
        "--steps",
        "2",
        "--repeat",
        "2",
        "--json",
        "--project",
        str(project),
        "nbs=4",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two OpenMP threads per process crawl on a shared 2-core machine
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(r.stdout), project / "exp"


def test_run_repeat_writes_trials_and_stops_without_a_finished_checkpoint(repeated):
    result, base = repeated
    assert result["run_dir"] == str(base) and len(result["trials"]) == 2
    rep = json.loads((base / "profile_repeat.json").read_text())
    assert rep["schema"] == "libreyolo.profile_repeat/v1" and rep == {k: result[k] for k in rep}
    sm = rep["step_ms"]
    assert set(sm) == {"mean", "std", "min", "median", "max"} and rep["img_s"]["mean"] > 0 and sm["std"] >= 0
    steps = sorted(t["step_ms"] for t in rep["trials"])
    assert (sm["min"], sm["max"]) == (steps[0], steps[-1]) and sm["median"] == pytest.approx(sum(steps) / 2)
    assert rep["verdict"] in ("compute", "mixed") and sum(rep["verdicts"].values()) == 2
    # each trial ran in a process of its own, neither of them this test's nor the command's
    pids = [t["pid"] for t in rep["trials"]]
    assert rep["process"] == "fresh per trial" and len(set(pids)) == 2 and os.getpid() not in pids
    for k in (1, 2):
        run = base / f"prof_{k}"
        p = load_profile(run)
        w = p["window"]
        # only the window's steps ran: warmup 1, one unsynchronised, one synchronised
        assert (w["warmup_steps"], w["unsync_steps"], w["sync_steps"], w["steps_seen"]) == (1, 1, 1, 3)
        assert p["meta"]["workers"] == 0 and p["meta"]["imgsz"] == 64
        # the graph mode the run used (cuda_graph=auto trains eager on a CPU), which the verdict's lever reads
        assert (p["meta"]["cuda_graph"], p["meta"]["cuda_graph_setting"]) == ("false", "auto")
        events = list(read_events(run / "events.jsonl"))
        assert events[-1]["type"] == "run_end" and events[-1]["status"] == "profiled"
        assert events[0]["config"]["no_aug_epochs"] == 0 and events[0]["config"]["profile"] is True
        # no pictures drawn beside the window unless asked for (plots=true)
        assert events[0]["config"]["plots"] is False and not list(run.glob("*.jpg")) + list(run.glob("*.png"))
        kinds = [(e["kind"], e["epoch"], e["step"]) for e in events if e["type"] == "checkpoint"]
        assert kinds == [("last", 0, 0)]  # the start-of-run save only: no epoch-end "finished" checkpoint
        assert (run / "timeline.html").is_file() and (run / "profile_trace.json").is_file()


def test_repeat_prints_how_many_trials_gave_each_verdict_and_the_step_time_spread(monkeypatch, capsys):
    import libreyolo.cli.profile_run as run

    def trial(verdict, step_ms):
        return {"run_dir": f"prof_{step_ms}", "verdict": verdict, "step_ms": step_ms, "img_s": 1000 / step_ms}

    trials = [trial("compute", 12.0), trial("host / launch", 30.0), trial("compute", 10.0)]
    asked = []

    def run_profile(overrides, project, name, repeat, try_lever, fresh):
        asked.append(fresh)
        return {**run.summarize(trials, fresh), "run_dir": "exp", "repeat": "exp/profile_repeat.json", "try": None}

    monkeypatch.setattr(run, "run_profile", run_profile)
    assert main(["profile", "run", "shapes", "--repeat", "3"]) == 0
    out = capsys.readouterr().out
    assert "verdicts over 3 trials (a fresh process each): compute 2/3, host / launch 1/3" in out
    assert "step time min / median / max: 10.0 / 12.0 / 30.0 ms" in out
    assert main(["profile", "run", "shapes", "--repeat", "3", "--same-process"]) == 0
    assert "verdicts over 3 trials (one process): compute 2/3" in capsys.readouterr().out
    assert asked == [True, False]


def test_summary_phases_kernels_read_back(repeated, capsys):
    path = str(repeated[1] / "prof_1" / "profile.json")
    p = load_profile(path)
    assert main(["profile", "summary", path]) == 0
    out = capsys.readouterr().out
    assert f"verdict: {p['verdict']['name']}" in out and "step time" in out and "images / s" in out
    assert main(["profile", "summary", str(repeated[1] / "prof_1"), "--json"]) == 0  # a run folder works too
    assert json.loads(capsys.readouterr().out)["verdict"] == p["verdict"]
    assert main(["profile", "phases", path]) == 0
    out = capsys.readouterr().out
    assert all(ph in out for ph in ("data", "to_device", "forward", "loss", "backward", "optimizer", "ema"))
    assert main(["profile", "phases", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == p["phases"]
    assert main(["profile", "kernels", path]) == 0  # a CPU profile has no kernels: its CPU ops instead
    out = capsys.readouterr().out
    assert "no GPU kernels" in out and "aten::" in out
    assert main(["profile", "kernels", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


@pytest.fixture
def gpu_like(repeated, tmp_path):
    """The CPU profile with kernel rows as a CUDA run writes them, to exercise --top/--phase/--grep/--sort."""
    p = load_profile(repeated[1] / "prof_1")
    row = dict(category="conv", tensor_core=True, pct_gpu=10.0, mean_us=50.0)
    p["kernels"] = [
        {
            **row,
            "name": "sm90_xmma_fprop_implicit_gemm",
            "phase": "forward",
            "ms_per_step": 3.0,
            "count_per_step": 60.0,
        },
        {
            **row,
            "name": "sm90_xmma_fprop_implicit_gemm",
            "phase": "backward",
            "ms_per_step": 1.0,
            "count_per_step": 20.0,
        },
        {
            **row,
            "name": "sm90_xmma_dgrad_implicit_gemm",
            "phase": "backward",
            "ms_per_step": 2.0,
            "count_per_step": 100.0,
        },
        {
            **row,
            "name": "vectorized_elementwise_kernel",
            "category": "elementwise",
            "tensor_core": False,
            "phase": "optimizer",
            "ms_per_step": 0.5,
            "count_per_step": 500.0,
        },
    ]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(p))
    return str(path)


def test_kernels_top_phase_grep_sort(gpu_like, capsys):
    def rows(*args):
        assert main(["profile", "kernels", gpu_like, "--json", *args]) == 0
        return json.loads(capsys.readouterr().out)

    merged = rows()
    assert [r["name"] for r in merged][:2] == ["sm90_xmma_fprop_implicit_gemm", "sm90_xmma_dgrad_implicit_gemm"]
    assert merged[0]["ms_per_step"] == 4.0 and merged[0]["phase"] == "backward,forward" and merged[0]["mean_us"] == 50.0
    assert [r["name"] for r in rows("--phase", "backward", "--top", "1")] == ["sm90_xmma_dgrad_implicit_gemm"]
    assert [r["name"] for r in rows("--grep", "elementwise")] == ["vectorized_elementwise_kernel"]
    assert rows("--sort", "count")[0]["name"] == "vectorized_elementwise_kernel"
    assert main(["profile", "kernels", gpu_like, "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "sm90_xmma_fprop_implicit_gemm" in out and "vectorized_elementwise_kernel" not in out


def test_cli_errors_name_the_problem(tmp_path, gpu_like, capsys):
    assert main(["profile", "summary", str(tmp_path / "missing.json")]) == 2
    assert "missing.json does not exist" in capsys.readouterr().err
    (tmp_path / "x.json").write_text("{not json")
    assert main(["profile", "phases", str(tmp_path / "x.json")]) == 2
    assert "is not JSON" in capsys.readouterr().err
    assert main(["profile", "kernels", gpu_like, "--phase", "fwd"]) == 2
    assert "--phase 'fwd'" in capsys.readouterr().err
    assert main(["profile", "frobnicate"]) == 2
    assert "unknown profile command" in capsys.readouterr().err
    assert main(["profile", "run", "shapes", "--steps", "0"]) == 2
    assert "--steps 0" in capsys.readouterr().err


def test_a_profile_run_draws_no_pictures_unless_asked_and_never_validates(tmp_path):
    from libreyolo.cli.profile_run import run_keys

    keys = run_keys({"batch": 8, "val": True}, tmp_path, "p", False)
    assert keys["plots"] is False and keys["val"] is False and keys["profile"] is True and keys["batch"] == 8
    assert keys["model"] == "LibreYOLO9t" and keys["project"] == str(tmp_path) and keys["name"] == "p"
    assert run_keys({"plots": True, "model": "LibreYOLOXs"}, tmp_path, "p", True)["plots"] is True
