"""The console's non-UI pieces: RunState from events, the new-run form's command, GPU sampling (with a
stand-in NVML library), themes and the remembered settings."""

import pytest
from conftest import run_start_event

from libreyolo import events as ev
from libreyolo.cli.args import parse_kv
from libreyolo.config import TrainConfig
from libreyolo.errors import LibreYOLOError
from libreyolo_console import command
from libreyolo_console.gpu import GpuSampler
from libreyolo_console.settings import load_settings, save_settings, settings_path
from libreyolo_console.state import MAX_POINTS, RunState
from libreyolo_console.theming import load_themes, next_theme


def _d(e: ev.Event) -> dict:
    d = e.to_dict()
    ev.validate_event(d)  # every event a test feeds the console is a valid current-schema event
    return d


def _run_start(steps=10, t=0.0):
    return _d(
        run_start_event(
            run_dir="runs/exp",
            optimizer="AdamW(lr=0.001, momentum=0.9)",
            steps_per_epoch=steps,
            train_images=32,
            params=1000,
            resumed=True,
            t=t,
        )
    )


def _val(epoch, time_s=0.18, eval_s=0.4, losses=None):
    return _d(
        ev.Val(
            epoch=epoch,
            precision=0.5,
            recall=0.4,
            map50=0.3,
            map=0.2,
            losses=losses or {},
            images=8,
            time_s=time_s,
            eval_s=eval_s,
        )
    )


def _epoch_end(epoch, losses, time_s=5.0):
    return _d(
        ev.EpochEnd(
            epoch=epoch,
            losses=losses,
            lr={"pg0": 0.01},
            time_s=time_s,
            img_s=99.0,
            fitness=0.21,
            best_fitness=0.21,
            skipped_images=0,
        )
    )


def _step(epoch, step, steps=4, box=1.0, t=0.0):
    return _d(
        ev.Step(
            epoch=epoch,
            step=step,
            steps=steps,
            losses={"box": box, "cls": 2.0, "dfl": 3.0},
            lr=0.01,
            img_s=100.0,
            data_frac=0.1,
            step_ms=20.0,
            gpu_mem_gb=1.5,
            eta_s=60.0,
            t=t,
        )
    )


def test_run_state_folds_progress_losses_metrics_and_the_gpu_events():
    s = RunState()
    no_losses_yet = {**_step(0, 1, t=100.5), "losses": {}}  # the epoch's first read-back had not landed: no point
    s.apply(
        [
            _d(ev.EpochStart(epoch=0, epochs=2, steps=4, mosaic=True, t=100.0)),
            no_losses_yet,
            _step(0, 2, t=101.0),
            _step(0, 4, box=0.5, t=102.0),
            _val(0, time_s=1.0),
            _epoch_end(0, {"box": 0.5, "cls": 2.0, "dfl": 3.0}),
            _d(
                ev.Graph(
                    action="capture",
                    mode="network",
                    reason="first step",
                    shape=[8, 3, 64, 64],
                    allocated_before_mb=100,
                    allocated_after_mb=150,
                    delta_allocated_mb=50,
                    t=103.0,
                )
            ),
            _d(ev.Graph(action="fallback", mode="network", reason="dynamic shape", shape=[4, 3, 64, 64], t=104.0)),
            _d(ev.Vram(epoch=0, peak_allocated_mb=900, peak_reserved_mb=1200, device="cuda:0")),
            _d(
                ev.Profile(
                    verdict="dataloader",
                    why="data 60%",
                    levers=["workers=8"],
                    step_ms=20,
                    img_s=100,
                    utilization=0.4,
                    phases={"data": 12.0, "forward": 4.0},
                    artifacts={"timeline": "/x/timeline.html"},
                )
            ),
            {"type": "step", "v": 2, "t": 1.0},
        ]
    )  # malformed: counted, not fatal
    assert (s.epoch, s.step, s.epochs) == (1, 0, 2) and s.fraction == pytest.approx(0.5)
    assert [(x, lo["box"]) for x, lo in s.losses] == [(0.5, 1.0), (1.0, 0.5)]
    assert s.rows[0].map == 0.2 and s.rows[0].losses["box"] == 0.5 and s.best.epoch == 0 and s.epochs_done == 1
    assert (s.rows[0].val_s, s.rows[0].eval_s) == (1.0, 0.4)
    assert [g["action"] for g in s.graphs] == ["capture", "fallback"] and s.vram[0]["peak_reserved_mb"] == 1200
    assert s.profile["verdict"] == "dataloader" and s.bad_lines == 1 and s.t0 == 100.0


def test_run_state_resume_redraws_from_the_checkpoint_and_long_runs_stay_bounded():
    s = RunState()
    s.apply([_step(0, i, steps=10) for i in range(1, 9)])
    s.apply(
        [
            _d(
                ev.RunEnd(
                    status="interrupted", epochs_done=0, best_fitness=None, best=None, last=None, time_s=1, metrics={}
                )
            )
        ]
    )
    assert s.end["status"] == "interrupted"
    s.apply([_run_start(steps=10, t=5.0), _step(0, 5, steps=10)])  # the resumed process replays from step 4
    assert s.end is None and s.starts == 1 and s.last_step["step"] == 5
    assert [round(p[0], 2) for p in s.losses] == [0.1, 0.2, 0.3, 0.4, 0.5]
    s.apply([_step(e, 1, steps=1) for e in range(5 * MAX_POINTS)])
    assert len(s.losses) <= MAX_POINTS and s.losses[-1][0] <= 5 * MAX_POINTS


def test_form_keys_and_choices_are_what_the_cli_accepts():
    assert set(command.FORM_KEYS) <= set(TrainConfig.keys())
    for key, choices in command.CHOICES.items():
        assert key in command.FORM_KEYS
        for c in choices:
            parse_kv([f"{key}={c}"])  # raises if the CLI rejects a value the form offers
    base = command.defaults()
    assert all(base[key] in choices for key, choices in command.CHOICES.items())  # the form can show every default
    assert command.CHOICES["cuda_graph"][0] == base["cuda_graph"] == "auto"  # TrainConfig's default, offered first
    assert command.build_args(base) == [] and command.build_args({**base, "cuda_graph": "false"}) == [
        "cuda_graph=false"
    ]


def test_build_args_only_spells_out_changes_and_validates_like_the_cli(tmp_path):
    demo = command.defaults("shapes")
    assert demo["epochs"] == "30" and demo["imgsz"] == "128"  # the built-in dataset's own suggestions
    assert command.build_args(demo) == []
    assert command.command_line([]) == "libreyolo train"
    yaml_path = tmp_path / "my data.yaml"
    vals = {**demo, "data": str(yaml_path), "epochs": "30", "batch": "auto", "cuda_graph": "full", "workers": "auto"}
    args = command.build_args(vals, "lr0=0.02 cos_lr=true")
    # a real dataset defaults to 100 epochs: the form's 30 is now a change; workers=auto is the default
    assert args == [
        f"data={yaml_path}",
        "epochs=30",
        "batch=-1",
        "imgsz=128",
        "cuda_graph=full",
        "lr0=0.02",
        "cos_lr=true",
    ]
    assert command.command_line(args).startswith(f"libreyolo train 'data={yaml_path}' epochs=30")
    with pytest.raises(LibreYOLOError, match="imgsz"):
        command.build_args({**demo, "imgsz": "100"})
    with pytest.raises(LibreYOLOError, match="unknown key"):
        command.build_args(demo, "epoch=3")
    with pytest.raises(LibreYOLOError, match="set twice"):
        command.build_args(demo, "epochs=3")
    with pytest.raises(LibreYOLOError, match="chosen by the console"):
        command.build_args(demo, "project=elsewhere")


def test_data_and_model_are_checked_before_a_run_starts(tiny_data, tmp_path):
    assert command.check_data("shapes") is None
    assert command.check_data(str(tiny_data)) is None
    missing = command.check_data(str(tmp_path / "nope.yaml"))
    assert "nope.yaml" in missing and "does not exist" in missing
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: images\n")
    assert "names" in command.check_data(str(bad))
    assert command.check_model("LibreYOLO9t") is None and command.check_model("libreyolo9s") is None
    assert "LibreYOLO9t" in command.check_model("YOLOv8n")
    assert "does not exist" in command.check_model(str(tmp_path / "w.pt"))


class FakeNVML:
    """Stands in for pynvml: two GPUs, one of them without power readings."""

    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    class _Mem:
        used, total = 40 * 2**30, 80 * 2**30

    class _Util:
        gpu = 87

    class _Proc:
        def __init__(self, pid, used):
            self.pid, self.usedGpuMemory = pid, used

    def __init__(self, fail=False):
        self.fail, self.shut = fail, False

    def nvmlInit(self):
        if self.fail:
            raise self.NVMLError_LibraryNotFound("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shut = True

    def nvmlSystemGetDriverVersion(self):
        return b"570.1"

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, h):
        return self._Mem()

    def nvmlDeviceGetUtilizationRates(self, h):
        return self._Util()

    def nvmlDeviceGetTemperature(self, h, kind):
        return 61

    def nvmlDeviceGetPowerUsage(self, h):
        if h == 1:
            raise self.NVMLError("Not Supported")
        return 412_000

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [self._Proc(1234, 3 * 2**30), self._Proc(99, None)]


def test_gpu_sampler_reads_every_device_and_tolerates_missing_readings():
    nv = FakeNVML()
    g = GpuSampler(nv)
    snap = g.sample()
    assert snap.no_driver is None and snap.driver == "570.1" and len(snap.devices) == 2
    d0, d1 = snap.devices
    assert (d0.util, d0.mem_used_mb, d0.mem_total_mb, d0.temp_c, d0.power_w) == (87.0, 40 * 1024, 80 * 1024, 61, 412.0)
    assert d1.power_w is None and d0.procs == {1234: 3072.0, 99: None}
    assert snap.host.ram_total_gb > 0
    g.close()
    assert nv.shut


def test_gpu_sampler_without_a_driver_says_so_and_still_reports_the_host():
    snap = GpuSampler(FakeNVML(fail=True)).sample()
    assert snap.devices == [] and "no NVIDIA driver" in snap.no_driver and snap.host.cpus >= 1


def test_themes_load_and_the_choice_is_remembered(tmp_path, monkeypatch):
    names = [t.name for t in load_themes()]
    assert names == ["libreyolo-dark", "libreyolo-light", "libreyolo-high-contrast"]
    assert (
        next_theme("libreyolo-high-contrast", names) == "libreyolo-dark"
        and next_theme("nord", names) == "libreyolo-dark"
    )
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("LIBREYOLO_CONSOLE_CONFIG", raising=False)
    assert settings_path() == tmp_path / "libreyolo" / "console.yaml" and load_settings() == {}
    save_settings({"theme": "libreyolo-light"})
    assert load_settings() == {"theme": "libreyolo-light"}
    settings_path().write_text("theme: [unclosed\n")
    assert load_settings() == {}  # a broken file is reported and ignored, the console still starts


def test_gpu_panel_counts_the_run_s_own_memory_by_pid():
    from libreyolo_console.widgets.gpu_panel import GpuPanel

    panel = GpuPanel()
    panel.run_pids = {10, 11}
    assert panel._run_memory({10: 1024.0, 11: 2048.0, 99: 5.0}) == "run: 3.0 GB in 2 procs (+1 other proc)"
    assert panel._run_memory({10: None}) == "run: n/a in 1 proc"
    assert panel._run_memory({}) == "run: -"


def test_plots_redraw_only_when_their_curves_change():
    import asyncio

    from textual.app import App

    from libreyolo_console.widgets.plots import LossPlot, MetricsPlot

    class Plots(App):
        def compose(self):
            yield LossPlot()
            yield MetricsPlot()

    async def go():
        async with Plots().run_test() as pilot:
            loss, metrics = pilot.app.query_one(LossPlot), pilot.app.query_one(MetricsPlot)
            drawn = {"loss": 0, "metrics": 0}
            for name, w in (("loss", loss), ("metrics", metrics)):
                draw = w.draw
                w.draw = lambda data, name=name, draw=draw: (drawn.__setitem__(name, drawn[name] + 1), draw(data))
            s = RunState()
            for i in range(1, 4):  # three step events: the loss curve grows, the validation curves do not
                s.apply([_step(0, i)])
                for w in (loss, metrics):
                    w.show_state(s)
            assert drawn == {"loss": 3, "metrics": 1}
            s.apply([_val(0)])
            metrics.show_state(s)
            metrics.show_state(s)
            assert drawn["metrics"] == 2
            pilot.app.theme = "textual-light"  # a new theme recolours the curves even though the data is the same
            await pilot.pause()
            assert drawn["metrics"] == 3

    asyncio.run(go())
