"""Multi-GPU pieces that need no second process: the global-batch rule, autobatch's fit, launch planning,
and the errors raised before any worker starts."""

import dataclasses
import re

import pytest

from libreyolo import LibreYOLO
from libreyolo.config import TrainConfig
from libreyolo.distributed.context import split_batch
from libreyolo.engine.autobatch import default_batch, fit_batch
from libreyolo.errors import ConfigError
from libreyolo.launch import CPU_WORLD_ENV, GUARD_MESSAGE, SPAWNED_ENV, DistributedError, spawn_plan

GiB = 2**30


def test_global_batch_error_text_is_exact():
    with pytest.raises(ConfigError) as e:
        split_batch(6, 4)
    assert str(e.value) == (
        "batch=6 is the global batch and must be divisible by world_size=4: each rank\n"
        "trains at batch // world_size, so this value would silently train at a\n"
        "different global batch than requested. Use batch=4 or batch=8."
    )
    with pytest.raises(ConfigError, match=r"Use batch=4\.$"):
        split_batch(3, 4)  # below the world size only one suggestion makes sense
    assert split_batch(32, 2) == 16 and split_batch(5, 1) == 5


def test_fit_batch_takes_the_largest_batch_within_the_budget_times_world_size():
    # 1 GiB fixed + 0.5 GiB per image; budget 0.6 * 80 GiB = 48 GiB -> (48 - 1) / 0.5 = 94 per GPU
    samples = [(b, (1 + 0.5 * b) * GiB) for b in (1, 2, 4, 8, 16)]
    assert fit_batch(samples, 0.6 * 80 * GiB, world_size=1, nbs=None) == (94, 94)
    assert fit_batch(samples, 0.6 * 80 * GiB, world_size=4, nbs=None) == (376, 94)  # a multiple of the world size
    # nbs caps the global batch, rounded down to a world-size multiple: more GPUs, fewer accumulation steps
    assert fit_batch(samples, 0.6 * 80 * GiB, world_size=3, nbs=64) == (63, 94)
    assert fit_batch(samples, 0.6 * 80 * GiB, world_size=1, nbs=64) == (64, 94)
    assert fit_batch(samples, 0.6 * 80 * GiB, world_size=128, nbs=64)[0] == 128  # never below one image per GPU
    # noisy samples still fit a line; an out-of-memory at 16 bounds the answer below 16
    noisy = [(1, 1.6 * GiB), (2, 1.9 * GiB), (4, 3.1 * GiB), (8, 5.0 * GiB)]
    assert fit_batch(noisy, 12 * GiB, oom_at=None)[1] in range(20, 26)
    assert fit_batch(noisy, 12 * GiB, oom_at=16)[1] == 15
    assert fit_batch([(1, 30 * GiB)], 10 * GiB)[1] == 1  # nothing fits: one image, not zero


def test_cpu_autobatch_keeps_the_default_as_a_world_multiple():
    assert default_batch(1) == 16 and default_batch(2) == 16 and default_batch(3) == 15 and default_batch(32) == 32


def test_spawn_plan(monkeypatch):
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", CPU_WORLD_ENV):
        monkeypatch.delenv(k, raising=False)
    cfg = TrainConfig.from_overrides({"device": "cpu"})
    assert spawn_plan(cfg) is None
    monkeypatch.setenv(CPU_WORLD_ENV, "2")
    assert spawn_plan(cfg) == ([], 2)
    monkeypatch.setenv(CPU_WORLD_ENV, "two")
    with pytest.raises(ConfigError, match=CPU_WORLD_ENV):
        spawn_plan(cfg)
    # under torchrun the process is already one of N: nothing is spawned, whatever device says
    monkeypatch.setenv(CPU_WORLD_ENV, "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert spawn_plan(cfg) is None


@pytest.fixture
def cpu_world_2(monkeypatch):
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", SPAWNED_ENV):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv(CPU_WORLD_ENV, "2")


def test_lambda_callback_is_refused_before_any_process_starts(cpu_world_2, tiny_data, tmp_path):
    def local_logger(e):
        pass

    for bad, idx in (([lambda e: None], 0), ([print, local_logger], 1)):
        with pytest.raises(ConfigError) as e:
            LibreYOLO("LibreYOLO9t").train(data=str(tiny_data), device="cpu", project=str(tmp_path), callbacks=bad)
        msg = str(e.value)
        assert msg.startswith(f"callbacks[{idx}]=") and "module-level class" in msg and "events.jsonl" in msg, msg
    assert not (tmp_path / "exp").exists()


def test_indivisible_global_batch_is_refused_by_the_launcher(cpu_world_2, tiny_data, tmp_path, monkeypatch):
    monkeypatch.setenv(CPU_WORLD_ENV, "4")
    with pytest.raises(
        ConfigError, match=re.escape("batch=6 is the global batch and must be divisible by world_size=4")
    ):
        LibreYOLO("LibreYOLO9t").train(data=str(tiny_data), batch=6, device="cpu", project=str(tmp_path))


def test_launch_inside_a_spawned_worker_is_the_guard_error(cpu_world_2, tiny_data, monkeypatch):
    monkeypatch.setenv(SPAWNED_ENV, "1")
    with pytest.raises(DistributedError) as e:
        LibreYOLO("LibreYOLO9t").train(data=str(tiny_data), device="cpu")
    assert str(e.value) == GUARD_MESSAGE


def test_family_without_ddp_support_names_the_alternative(cpu_world_2, tiny_data):
    m = LibreYOLO("LibreYOLO9t")
    m.family = dataclasses.replace(m.family, supports_ddp=False)
    with pytest.raises(ConfigError, match=r"cannot train distributed.*device=0.*torchrun"):
        m.train(data=str(tiny_data), device="cpu")


def test_launcher_settles_batch_minus_one_before_the_workers_on_cpu(tiny_data, capsys):
    from libreyolo.launch import _parent_batch

    cfg = TrainConfig.from_overrides({"data": str(tiny_data), "device": "cpu", "batch": -1})
    assert _parent_batch(LibreYOLO("LibreYOLO9t"), cfg, [], 3) == default_batch(3) == 15
    assert "batch=-1 (autobatch) needs a CUDA device; using batch=15 on cpu" in capsys.readouterr().out
    cfg = TrainConfig.from_overrides({"data": str(tiny_data), "device": "cpu", "batch": 6})
    with pytest.raises(ConfigError, match="world_size=4"):
        _parent_batch(LibreYOLO("LibreYOLO9t"), cfg, [], 4)
