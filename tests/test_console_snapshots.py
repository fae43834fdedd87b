"""Snapshot tests of the console's main screens at 80x24 and 120x40 (pytest-textual-snapshot).

Deterministic by construction: a fixed events file (fixed times), a fixed GPU sample, relative paths, UTC,
and a crashed run whose recorded pid (1) exists with another start time, so it is never taken for live.
Update after an intended change with `python -m pytest tests/test_console_snapshots.py --snapshot-update`
and look at the SVGs before committing them."""

import time

import pytest
from conftest import run_start_event

from libreyolo import events as ev
from libreyolo.families import get_family
from libreyolo_console.app import ConsoleApp
from libreyolo_console.gpu import DeviceSample, GpuSnapshot, HostSample
from libreyolo_console.screens.run import RunScreen
from libreyolo_console.supervisor import ProcessRecord, write_record

SIZES = {"80x24": (80, 24), "120x40": (120, 40)}
T0 = 1_790_000_000.0
TERMS = get_family("yolo9").loss_terms


class FixedSampler:
    """A GPU sampler that always reports the same two H200s (one running our run's pid)."""

    def __init__(self, devices: bool = True):
        self.devices = devices

    def sample(self) -> GpuSnapshot:
        host = HostSample(cpu_percent=37.0, cpus=16, ram_used_gb=41.5, ram_total_gb=128.0)
        if not self.devices:
            return GpuSnapshot([], host, "no NVIDIA driver (libnvidia-ml.so not found): showing CPU and RAM")
        devs = [
            DeviceSample(i, "NVIDIA H200", util, used, 143771.0, 54.0 + i, power, 700.0, procs)
            for i, util, used, power, procs in ((0, 97.0, 41230.0, 612.0, {4242: 40960.0}), (1, 0.0, 512.0, 74.0, {}))
        ]
        return GpuSnapshot(devs, host, None, "570.86")

    def close(self) -> None:
        pass


def _start(epochs: int, t: float = T0, device: str = "cuda:0") -> ev.RunStart:
    cpu = not device.startswith("cuda")
    return run_start_event(
        model="LibreYOLO9s",
        nc=3,
        names=["circle", "square", "triangle"],
        data="shapes",
        epochs=epochs,
        batch=64,
        batch_per_rank=64,
        accumulate=1,
        imgsz=640,
        device=device,
        amp=not cpu,
        amp_dtype="float32" if cpu else "bfloat16",
        cuda_graph_mode="false" if cpu else "full",
        cuda_graph_reason="cuda_graph=auto: CUDA graphs need a CUDA device; training eager on cpu"
        if cpu
        else "cuda_graph=auto: the whole step in one graph (yolo9 supports it, one CUDA process)",
        loss_terms=list(TERMS),
        workers=8,
        optimizer="AdamW(lr=0.001429, momentum=0.9)",
        steps_per_epoch=50,
        train_images=3200,
        val_images=640,
        params=6_550_000,
        pid=4242,
        t=t,
    )


def _losses(f: float) -> dict[str, float]:
    return dict(zip(TERMS, (1.2 * f, 2.0 * f, 1.5 * f), strict=True))


def _finished_run(run_dir) -> None:
    w = ev.EventWriter(run_dir / "events.jsonl")
    t = T0
    w.write(_start(epochs=4))
    w.write(
        ev.Amp(
            enabled=True,
            dtype="bfloat16",
            scaler=False,
            scale=None,
            skipped_steps=0,
            epoch=None,
            reason="bf16 on H200",
            t=t,
        )
    )
    w.write(
        ev.Graph(
            action="capture",
            mode="full",
            reason="captured the whole micro step (target capacity 16) after 3 steps of shape [64, 3, 640, 640]",
            shape=[64, 3, 640, 640],
            allocated_before_mb=5120.0,
            allocated_after_mb=5376.0,
            reserved_before_mb=8192.0,
            reserved_after_mb=8704.0,
            delta_allocated_mb=256.0,
            delta_reserved_mb=512.0,
            t=t + 4,
        )
    )
    for epoch in range(4):
        w.write(ev.EpochStart(epoch=epoch, epochs=4, steps=50, mosaic=epoch < 3, t=t))
        for step in range(10, 51, 10):
            t += 2.0
            f = 1 / (1 + epoch + step / 50)
            w.write(
                ev.Step(
                    epoch=epoch,
                    step=step,
                    steps=50,
                    losses=_losses(f),
                    lr=0.001,
                    img_s=1600.0 + 10 * epoch,
                    data_frac=0.04,
                    step_ms=40.0,
                    gpu_mem_gb=8.5,
                    eta_s=(3 - epoch) * 10 + (50 - step) / 5,
                    t=t,
                )
            )
        m = 0.2 * (epoch + 1)
        w.write(
            ev.Val(
                epoch=epoch,
                precision=min(m + 0.1, 1),
                recall=m,
                map50=min(m + 0.05, 1),
                map=m * 0.8,
                losses={},
                images=640,
                time_s=3.0,
                eval_s=1.2,
                per_class=_per_class(m),  # every epoch is a best so far: the trainer writes the rows each time
                t=t,
            )
        )
        w.write(
            ev.Vram(
                epoch=epoch,
                peak_allocated_mb=7000.0 + 10 * epoch,
                peak_reserved_mb=8704.0 + 64 * epoch,
                device="cuda:0",
                t=t,
            )
        )
        w.write(
            ev.EpochEnd(
                epoch=epoch,
                losses=_losses(f),
                lr={},
                time_s=13.0,
                img_s=1600.0,
                fitness=m,
                best_fitness=m,
                skipped_images=0,
                t=t,
            )
        )
        if epoch == 1:
            w.write(
                ev.Graph(
                    action="eager_shape",
                    mode="full",
                    reason="shape [40, 3, 640, 640, 16] differs from the captured one(s): it runs eager",
                    shape=[40, 3, 640, 640],
                    t=t,
                )
            )
        if epoch == 2:
            w.write(
                ev.Graph(
                    action="invalidate",
                    mode="full",
                    reason="a batch has more objects per image than the captured capacity 16: "
                    "capacity raised to 21, recapturing once stable",
                    shape=[64, 3, 640, 640],
                    t=t - 8,
                )
            )
            w.write(
                ev.Graph(
                    action="recapture",
                    mode="full",
                    reason="re-captured: capacity raised to 21; captured the whole micro step (target capacity 21)",
                    shape=[64, 3, 640, 640],
                    allocated_before_mb=5376.0,
                    allocated_after_mb=5440.0,
                    reserved_before_mb=8704.0,
                    reserved_after_mb=8704.0,
                    delta_allocated_mb=64.0,
                    delta_reserved_mb=0.0,
                    t=t - 6,
                )
            )
    w.write(
        ev.Profile(
            verdict="dataloader",
            why="the step waits 61% of its time for the next batch; GPU busy 35%",
            levers=[
                "workers=16 (8 now, 16 cores)",
                "cache=ram (3200 images fit in 4.1 GB)",
                "smaller imgsz for a first pass",
            ],
            step_ms=40.0,
            img_s=1600.0,
            utilization=0.35,
            phases={
                "data": 24.4,
                "to_device": 1.2,
                "forward": 4.1,
                "loss": 1.9,
                "backward": 6.3,
                "optimizer": 1.6,
                "ema": 0.5,
            },
            artifacts={
                "timeline": "runs/train/exp/profile/timeline.html",
                "summary": "runs/train/exp/profile/summary.json",
            },
            t=t,
        )
    )
    w.write(
        ev.RunEnd(
            status="finished",
            epochs_done=4,
            best_fitness=0.64,
            best="runs/train/exp/weights/best.pt",
            last="runs/train/exp/weights/last.pt",
            time_s=52.0,
            metrics={"map": 0.64},
            t=t + 1,
        )
    )
    w.close()
    (run_dir / "stdout.log").write_text(
        "$ libreyolo train model=LibreYOLO9s batch=64 imgsz=640 epochs=4\nfinished after 4 epoch(s)\n"
    )


def _crashed_run(run_dir) -> None:
    w = ev.EventWriter(run_dir / "events.jsonl")
    w.write(_start(epochs=30, t=T0 + 100))
    w.write(ev.EpochStart(epoch=0, epochs=30, steps=50, mosaic=True, t=T0 + 1))
    w.write(
        ev.Step(
            epoch=0,
            step=20,
            steps=50,
            losses=dict(zip(TERMS, (1.1, 2.2, 1.4), strict=True)),
            lr=0.0005,
            img_s=1500.0,
            data_frac=0.05,
            step_ms=42.0,
            gpu_mem_gb=70.1,
            eta_s=3000.0,
            t=T0 + 30,
        )
    )
    w.close()
    (run_dir / "weights").mkdir()
    (run_dir / "weights" / "last.pt").write_bytes(b"")
    (run_dir / "stdout.log").write_text(
        "$ libreyolo train batch=512 imgsz=1280 epochs=30\nEpoch 1/30: 50 steps\n"
        "Traceback (most recent call last):\n  ...\ntorch.OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 20.00 GiB\n"
    )
    # pid 1 is alive but started at another time: the run's own process is gone
    write_record(
        run_dir,
        ProcessRecord(
            pid=1, pgid=1, create_time=12.0, cmdline=["python", "-m", "libreyolo.cli.main", "train"], started=T0
        ),
    )


def _cpu_run(run_dir) -> None:
    """A run on a machine without a GPU, mid-way: steps and an epoch, and no graph, vram or profile events."""
    w = ev.EventWriter(run_dir / "events.jsonl")
    w.write(_start(epochs=30, t=T0 + 200, device="cpu"))
    w.write(ev.EpochStart(epoch=0, epochs=30, steps=50, mosaic=True, t=T0 + 201))
    for step in range(10, 51, 10):
        w.write(
            ev.Step(
                epoch=0,
                step=step,
                steps=50,
                losses=_losses(1 / (1 + step / 50)),
                lr=0.001,
                img_s=12.0,
                data_frac=0.1,
                step_ms=5000.0,
                gpu_mem_gb=0.0,
                eta_s=7000.0,
                t=T0 + 200 + step * 5,
            )
        )
    w.write(
        ev.RunEnd(
            status="interrupted",
            epochs_done=0,
            best_fitness=None,
            best=None,
            last="runs/train/exp3/weights/last.pt",
            time_s=260.0,
            metrics={},
            t=T0 + 460,
        )
    )
    w.close()


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.setenv("LIBREYOLO_CONSOLE_CONFIG", str(tmp_path / "console.yaml"))
    monkeypatch.delenv("NO_COLOR", raising=False)
    root = tmp_path / "runs" / "train"
    for name, make in (("exp", _finished_run), ("exp2", _crashed_run)):
        (root / name).mkdir(parents=True)
        make(root / name)
    cpu = tmp_path / "cpu"  # outside the project: the run list's snapshots stay as they were
    cpu.mkdir()
    _cpu_run(cpu)
    for name in ("exp", "exp2", "../../cpu"):
        for d in ev.read_events(root / name / "events.jsonl"):
            ev.validate_event(d)  # the fixtures are events the trainer could write today
    yield "runs/train"
    monkeypatch.undo()
    time.tzset()


def _per_class(m: float) -> list[dict]:
    """The shapes classes' rows of a validation whose mAP50-95 is 0.8 m: the classes spread around it."""
    rows = []
    for k, name in enumerate(("circle", "square", "triangle")):
        x = 0.8 * m * (0.9 + 0.1 * k)
        rows.append(
            {"class": name, "images": 300 + 10 * k, "instances": 500 + 20 * k}
            | {"precision": min(x + 0.1, 1), "recall": x, "map50": min(x + 0.05, 1), "map": x}
        )
    return rows


def _run_view(tab: str = "overview"):
    async def ready(pilot) -> None:
        app = pilot.app
        for _ in range(200):
            s = app.screen
            if (
                isinstance(s, RunScreen)
                and s.status != "?"
                and (s.state.end is not None or s.state.last_step is not None)
                and app.gpu_snapshot is not None
            ):
                break
            await pilot.pause(0.05)
        await pilot.press(str(("overview", "metrics", "gpu", "profiler", "graphs", "log").index(tab) + 1))
        await pilot.pause(0.6)  # two redraw ticks

    return ready


async def _list_ready(pilot) -> None:
    for _ in range(200):
        if getattr(pilot.app.screen, "loaded", False):
            break
        await pilot.pause(0.05)
    await pilot.pause(0.2)


@pytest.mark.parametrize("size", SIZES)
def test_run_list(snap_compare, project, size):
    assert snap_compare(
        ConsoleApp(project=project, gpu_sampler=FixedSampler()), terminal_size=SIZES[size], run_before=_list_ready
    )


@pytest.mark.parametrize("size", SIZES)
def test_new_run_form(snap_compare, project, size):
    async def open_form(pilot) -> None:
        await _list_ready(pilot)
        await pilot.press("n")
        await pilot.pause(0.3)

    assert snap_compare(
        ConsoleApp(project=project, gpu_sampler=FixedSampler()), terminal_size=SIZES[size], run_before=open_form
    )


@pytest.mark.parametrize("size", SIZES)
def test_finished_run_overview(snap_compare, project, size):
    app = ConsoleApp(project=project, attach="runs/train/exp", gpu_sampler=FixedSampler())
    assert snap_compare(app, terminal_size=SIZES[size], run_before=_run_view())


@pytest.mark.parametrize("tab", ["metrics", "gpu", "profiler", "graphs"])
def test_run_panels(snap_compare, project, tab):
    app = ConsoleApp(project=project, attach="runs/train/exp", gpu_sampler=FixedSampler())
    assert snap_compare(app, terminal_size=SIZES["80x24"], run_before=_run_view(tab))


def test_crashed_run_without_a_driver(snap_compare, project):
    app = ConsoleApp(project=project, attach="runs/train/exp2", gpu_sampler=FixedSampler(devices=False))
    assert snap_compare(app, terminal_size=SIZES["80x24"], run_before=_run_view())


def test_high_contrast_theme_with_no_color(snap_compare, project, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    app = ConsoleApp(
        project=project, attach="runs/train/exp", gpu_sampler=FixedSampler(), theme="libreyolo-high-contrast"
    )
    assert snap_compare(app, terminal_size=SIZES["80x24"], run_before=_run_view())


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("tab", ["profiler", "graphs"])
def test_cpu_run_panels_say_what_would_fill_them(snap_compare, project, tab, size):
    app = ConsoleApp(project=project, attach="cpu", gpu_sampler=FixedSampler(devices=False))
    assert snap_compare(app, terminal_size=SIZES[size], run_before=_run_view(tab))
