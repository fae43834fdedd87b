"""The profiler on real CPU training: the window, its hooks, the artifacts and the event."""

import html
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.config import TrainConfig
from libreyolo.engine.step import NO_PHASES
from libreyolo.engine.trainer import Trainer
from libreyolo.events import read_events, validate_event
from libreyolo.model import run_extensions
from libreyolo.profiler import attach
from libreyolo.profiler.result import SCHEMA, SUMMARY_SCHEMA
from libreyolo.profiler.schema import ProfileFileError, load_profile, validate

TINY = dict(imgsz=64, batch=4, workers=0, device="cpu", warmup_epochs=0, val=False)


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """On a shared 2-core machine two OpenMP threads per process can make a CPU step 30x slower; one keeps it short."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class Spy:
    """An after_step hook installed before training: the window must chain it and give it back."""

    def __init__(self):
        self.phases, self.profiler_on = [], []

    def __call__(self, trainer):
        self.phases.append(type(trainer.phases).__name__)
        self.profiler_on.append(torch._C._autograd._profiler_enabled())


def train_with_spy(data, project, **kw):
    m = LibreYOLO("LibreYOLO9t")
    args = {**TINY, "data": str(data), "project": str(project), **kw}
    cfg = TrainConfig.from_overrides(args, family=m.family)
    trainer = Trainer(m, cfg, run_extensions(cfg))
    spy = trainer.after_step = Spy()
    trainer.train()
    return trainer, spy


@pytest.fixture(scope="module")
def profiled(tiny_data, tmp_path_factory):
    """16 steps (4 epochs of 4), accumulate 1: warmup 5 (across an epoch end), then 4 unsynchronised steps (across
    another), then 3 synced, then 4 ordinary ones."""
    trainer, spy = train_with_spy(
        tiny_data, tmp_path_factory.mktemp("prof"), epochs=4, nbs=4, profile=True, profile_warmup=5, profile_steps=7
    )
    return trainer, spy, trainer.s.run_dir


def test_window_discards_warmup_measures_two_halves_then_hands_back(profiled):
    trainer, spy, run = profiled
    # steps 1-5 warmup (no hooks), 6-12 measured (the recorder), 13-16 the ordinary loop again
    assert spy.phases == ["NoPhases"] * 5 + ["Recorder"] * 7 + ["NoPhases"] * 4
    assert spy.profiler_on == [False] * 5 + [True] * 4 + [False] * 7  # torch.profiler runs in the first half only
    assert trainer.phases is NO_PHASES and trainer.after_step is spy
    assert not torch._C._autograd._profiler_enabled()
    p = load_profile(run)
    w = p["window"]
    assert (w["warmup_steps"], w["unsync_steps"], w["sync_steps"], w["steps_seen"]) == (5, 4, 3, 12)
    assert p["headline"]["steps_to_verdict_end"] == 9  # the verdict's half ended at step 9 of the run
    # step 8 ended epoch 2: its segment closed before the epoch's end work, the next one opened at step 9
    assert w["segments"] == 2 and w["traced_steps"] == 4
    ends = [e for e in read_events(run / "events.jsonl") if e["type"] == "run_end"]
    assert ends[-1]["status"] == "finished" and ends[-1]["epochs_done"] == 4  # training went on to the end
    assert p["meta"]["image_cache"] == {"images": 16, "held_at_start": 16, "held_at_end": 16}  # after epoch 1
    assert "being filled" not in p["verdict"]["why"]


def test_window_rounds_to_accumulation_boundaries(tiny_data, tmp_path):
    # nbs=12, batch 4: accumulate 3; with 4 steps an epoch the optimizer steps after local steps 3 and 4
    trainer, spy = train_with_spy(
        tiny_data, tmp_path, epochs=2, nbs=12, profile=True, profile_warmup=1, profile_steps=2
    )
    w = load_profile(trainer.s.run_dir)["window"]
    assert w["accumulate"] == 3
    # warmup 1 ends at the first boundary (step 3); each half needs >= 1 step and ends on a boundary:
    # step 4 (an epoch's last), then steps 5..7 (7 is the next boundary)
    assert (w["warmup_steps"], w["unsync_steps"], w["sync_steps"]) == (3, 1, 3)
    assert spy.phases == ["NoPhases"] * 3 + ["Recorder"] * 4 + ["NoPhases"]
    assert trainer.phases is NO_PHASES and trainer.after_step is spy


def test_the_window_records_the_image_cache_being_filled(tiny_data, tmp_path):
    """cache=auto (the default) stores each image as it is first decoded: a window inside the first epoch records
    how many of the training images the cache held at its start and at its end, and the why says so; the
    module's run, whose window starts in its second epoch, finds them all held and says nothing of it."""
    trainer, _ = train_with_spy(
        tiny_data, tmp_path, epochs=1, nbs=4, mosaic=0, cache="auto", profile=True, profile_warmup=1, profile_steps=2
    )
    p = load_profile(trainer.s.run_dir)
    fill = p["meta"]["image_cache"]
    n = fill["images"]
    assert n == 16 and 4 <= fill["held_at_start"] < fill["held_at_end"] < n, fill  # batch 4, no mosaic: 4 a step
    assert f"it held {fill['held_at_start']} of the {n} training images when the window started" in p["verdict"]["why"]


def test_profile_off_attaches_nothing(tiny_data, tmp_path):
    trainer, spy = train_with_spy(tiny_data, tmp_path, epochs=1)
    assert spy.phases == ["NoPhases"] * 4 and not any(spy.profiler_on)
    assert trainer.after_step is spy and trainer.phases is NO_PHASES
    # no closer of the profiler's among the run's (renderer, event writer, distributed context, caches)
    assert not any(
        type(getattr(c, "__self__", c)).__module__.startswith("libreyolo.profiler") for c in trainer.s.closers
    )
    assert not (trainer.s.run_dir / "profile.json").exists()
    assert "profile" not in [e["type"] for e in read_events(trainer.s.run_dir / "events.jsonl")]


def test_short_run_stops_the_profiler_and_warns(tiny_data, tmp_path):
    # warmup 0: measured from the very first step; 3 + 3 steps needed, the run has 4
    trainer, spy = train_with_spy(tiny_data, tmp_path, epochs=1, nbs=4, profile=True, profile_warmup=0, profile_steps=6)
    assert spy.phases == ["Recorder"] * 4 and spy.profiler_on == [True] * 3 + [False]
    assert trainer.phases is NO_PHASES and trainer.after_step is spy and not torch._C._autograd._profiler_enabled()
    warnings = [
        e for e in read_events(trainer.s.run_dir / "events.jsonl") if e["type"] == "warning" and e["code"] == "profile"
    ]
    assert (
        len(warnings) == 1
        and "ended after 4 step(s)" in warnings[0]["message"]
        and "profile_steps=6" in warnings[0]["message"]
    )
    assert not (trainer.s.run_dir / "profile.json").exists()


class CapturingSpy(Spy):
    """Makes the step runner report a CUDA graph capture in the given steps, as a graph runner counts its own."""

    def __init__(self, capture_at):
        super().__init__()
        self.capture_at, self.n = set(capture_at), 0

    def __call__(self, trainer):
        super().__call__(trainer)
        self.n += 1
        if self.n in self.capture_at:
            trainer.s.step.captures += 1


def test_the_window_moves_past_steps_that_captured_a_graph(tiny_data, tmp_path):
    # warmup 2, then 2 + 2 steps. Step 3 (the first measured) captures: the first half starts again after it
    # (steps 4-5); step 7, in the second half, captures: it is left out and step 8 completes that half.
    m = LibreYOLO("LibreYOLO9t")
    args = {**TINY, "data": str(tiny_data), "project": str(tmp_path), "epochs": 2, "nbs": 4}
    args.update(profile=True, profile_warmup=2, profile_steps=4)
    trainer = Trainer(m, TrainConfig.from_overrides(args, family=m.family), [attach])
    spy = trainer.after_step = CapturingSpy({3, 7})
    trainer.train()
    # the profiler of the first try (step 3) is dropped; a fresh one measures steps 4-5
    assert spy.profiler_on == [False] * 2 + [True] * 3 + [False] * 3
    assert trainer.phases is NO_PHASES and trainer.after_step is spy
    p = load_profile(trainer.s.run_dir)
    w = p["window"]
    assert (w["warmup_steps"], w["unsync_steps"], w["sync_steps"], w["steps_seen"]) == (3, 2, 2, 8)
    assert w["moved_past_captures"] == [3, 7] and p["headline"]["window_moved_past"] == [3, 7]
    assert p["headline"]["steps_to_verdict_end"] == 5
    assert w["traced_steps"] == 2  # the trace holds the new window's steps only
    assert "moved past the CUDA graph capture(s) at step(s) 3, 7" in p["verdict"]["why"]


@pytest.mark.parametrize("waits", [True, False], ids=["loader-bound", "loader-ahead"])
def test_the_window_starts_after_the_loaders_prefetched_batches_and_their_refill(
    tiny_data, tmp_path, monkeypatch, waits
):
    """workers=2 on CPU: the loader sends 2 x 4 = 8 batch indices to its workers when its pass starts, then one more
    each time a step takes a batch. The window discards those 8 steps after profile_warmup=1, so the first measured
    step's batch was requested only after the warmup's step had run: it cannot come from the queue that filled
    during the setup and the warmup. Counted from the sampler (which runs in the main process), not from timing.
    Then it goes on discarding until a step waited for its batch (the batches a slow loader made while the full
    queue was consumed are not measured either), or for 8 more steps where none waits: which steps wait is set
    here through the threshold (every timed step waits, or none does), not left to this machine's timing."""
    from libreyolo.data.loader import TrainBatchSampler
    from libreyolo.profiler import prefetch as prefetch_mod

    monkeypatch.setattr(prefetch_mod, "WAITED_S", 0.0 if waits else float("inf"))
    monkeypatch.setattr(prefetch_mod, "WAITED_SHARE", 0.0)
    spy = Spy()
    requested: list[int] = []  # per batch the sampler handed the loader: the steps finished by then
    real_iter = TrainBatchSampler.__iter__

    def counting_iter(self):
        for b in real_iter(self):
            requested.append(len(spy.phases))
            yield b

    monkeypatch.setattr(TrainBatchSampler, "__iter__", counting_iter)
    m = LibreYOLO("LibreYOLO9t")
    epochs = 3 if waits else 5
    args = {**TINY, "data": str(tiny_data), "project": str(tmp_path), "epochs": epochs, "nbs": 4, "workers": 2}
    args.update(profile=True, profile_warmup=1, profile_steps=2)
    trainer = Trainer(m, TrainConfig.from_overrides(args, family=m.family), [attach])
    trainer.after_step = spy
    trainer.train()
    # one pass over the epochs of 4 batches: 8 indices at its start, then batch k when batch k - 8 was taken
    assert requested == [max(0, k - 8) for k in range(4 * epochs)]
    p = load_profile(trainer.s.run_dir)
    w = p["window"]
    assert w["prefetch_batches"] == 8 and p["meta"]["loader_queue"] == "8 prefetched batches (2 workers x 4)"
    # warmup 1 + the 8 queued batches discarded, then the drain: 1 step (it waited) or 8 (none did)
    drain = 1 if waits else 8
    assert w["drain_steps"] == drain
    assert (w["warmup_steps"], w["unsync_steps"], w["sync_steps"], w["steps_seen"]) == (9 + drain, 1, 1, 11 + drain)
    # the drain's steps are timed (their data phase), the ones before are not
    assert spy.phases == ["NoPhases"] * 9 + ["Recorder"] * (drain + 2) + ["NoPhases"] * (4 * epochs - 11 - drain)
    first = w["warmup_steps"]  # the first measured step's batch (0-based: step n takes batch n - 1)
    assert requested[first] >= args["profile_warmup"]  # requested after the warmup's steps had run
    assert requested[args["profile_warmup"]] == 0  # without the discard it would have been queued before step 1
    why = p["verdict"]["why"]
    assert "The window started after the loader's 8 prefetched batches (2 workers x 4) had been consumed" in why
    if waits:
        assert "It then discarded 1 more step until one waited for its batch" in why
    else:
        assert "No step waited for its batch in the 8 after them either: the loader keeps ahead of the step." in why


def test_a_step_waited_for_its_batch_only_when_the_wait_is_a_share_of_the_step():
    """The drain's test of a dry queue: a wait of a few ms in a long eager step (as in trial 1 of the H100's one-worker
    case, 181 ms steps, where such a wait ended the drain with the workers' queue still full) is not one; the wait of
    a step that a loader at 300 ms a batch serves is, and so is a short step's wait past both floors."""
    from libreyolo.profiler.prefetch import WAITED_SHARE, waited_for_batch

    assert not waited_for_batch(0.004, 0.181)  # a hiccup: over 2 ms, 2% of the step
    assert waited_for_batch(0.150, 0.300)  # the loader-bound steady state: half the step
    assert waited_for_batch(0.003, 0.010)  # 30% of a short step
    assert not waited_for_batch(0.0015, 0.003)  # half of a tiny step, but under the 2 ms a queue's get never takes
    # the share sits at half the verdict's threshold: a step that waits as a dataloader verdict's does ends the drain
    from libreyolo.profiler.verdict import DATA_FRAC

    assert waited_for_batch(DATA_FRAC * 0.1, 0.1) and WAITED_SHARE < DATA_FRAC


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 15 workers are counted, never started
def test_the_loader_queue_counts_workers_prefetch_and_staging():
    """The depth the window discards, from the loaders data/loader.py builds: workers x prefetch_factor, plus the
    batches PinnedStager stages ahead on CUDA (with workers=0 too: its thread then loads them)."""
    from libreyolo.data.loader import train_loader
    from libreyolo.profiler.prefetch import loader_queue

    cuda = torch.device("cuda", 0)  # building a staged loader touches no GPU; iterating it would

    def depth(workers: int, pin: bool) -> str:
        return loader_queue(train_loader(list(range(64)), 4, workers, 0, pin, device=cuda)).describe()

    assert depth(15, True) == "33 prefetched batches (15 workers x 2 + 3 staged)"
    assert depth(1, True) == "7 prefetched batches (1 worker x 4 + 3 staged)"
    assert depth(0, True) == "3 prefetched batches (3 staged)"
    assert depth(2, False) == "8 prefetched batches (2 workers x 4)"
    assert loader_queue(train_loader(list(range(64)), 4, 0, 0, False)).batches == 0  # CPU, in-process loading
    assert loader_queue(None).batches == 0


def test_ddp_is_ignored_with_one_warning():
    emitted = []
    trainer = SimpleNamespace(
        s=SimpleNamespace(world_size=2, closers=[]),
        cfg=TrainConfig(),
        emit=emitted.append,
        phases=NO_PHASES,
        after_step=None,
    )
    assert attach(trainer) is None
    assert [(e.type, e.code) for e in emitted] == [("warning", "profile")] and "DDP" in emitted[0].message
    assert trainer.phases is NO_PHASES and trainer.after_step is None and trainer.s.closers == []


def test_artifacts_match_their_schemas(profiled):
    _, _, run = profiled
    p = load_profile(run)
    assert p["schema"] == SCHEMA and p["verdict"]["name"] == "compute"  # CPU, no sleeping loader
    validate(json.loads((run / "profile_summary.json").read_text()), SUMMARY_SCHEMA, "profile_summary.json")
    assert {r["name"] for r in p["phases"]} == {"data", "to_device", "forward", "loss", "backward", "optimizer", "ema"}
    assert p["headline"]["utilization"] is None and p["kernels"] == [] and p["cpu_ops"]
    assert p["headline"]["step_ms"] > 0 and p["headline"]["img_s"] > 0
    # a Chrome trace (Perfetto, chrome://tracing, Nsight): complete events with names and µs times, our ranges inside
    trace = json.loads((run / "profile_trace.json").read_text())
    complete = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert complete and all({"name", "ts", "dur", "pid", "tid"} <= e.keys() for e in complete)
    names = {e["name"] for e in complete}
    assert {"libreyolo::segment", "libreyolo::step", "libreyolo::forward", "libreyolo::backward"} <= names
    # the event carries the verdict and where the files are
    prof = [e for e in read_events(run / "events.jsonl") if e["type"] == "profile"]
    assert len(prof) == 1
    validate_event(prof[0])
    assert prof[0]["verdict"] == p["verdict"]["name"] and set(prof[0]["artifacts"]) == {
        "timeline",
        "trace",
        "summary",
        "profile",
    }
    assert all(Path(path).is_file() for path in prof[0]["artifacts"].values())


def test_timeline_is_self_contained(profiled):
    html = (profiled[2] / "timeline.html").read_text()
    assert "<script src" not in html and "<link" not in html and "@import" not in html
    assert "http://" not in html and "https://" not in html  # nothing to fetch: it opens offline
    start = html.index('<script id="profile-data" type="application/json">') + len(
        '<script id="profile-data" type="application/json">'
    )
    data = json.loads(html[start : html.index("</script>", start)])
    assert data["verdict"]["name"] == "compute" and data["events"] and data["lanes"][0]["name"] == "phases · CPU"
    assert len(data["segments"]) == 2


def test_bad_profile_files_name_the_file_and_the_field(profiled, tmp_path):
    p = json.loads((profiled[2] / "profile.json").read_text())
    p["headline"]["step_ms"] = "fast"
    del p["kernels"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(p))
    with pytest.raises(
        ProfileFileError,
        match=r"bad\.json: not a valid libreyolo.profile/v1 file: .*kernels: missing.*headline\.step_ms",
    ):
        load_profile(bad)
    bad.write_text(json.dumps({**p, "schema": "libreyolo.profile/v0"}))
    with pytest.raises(ProfileFileError, match="schema is 'libreyolo.profile/v0'"):
        load_profile(bad)
    with pytest.raises(ProfileFileError, match="does not exist"):
        load_profile(tmp_path / "nope.json")


class SleepyDataset:
    """Wraps the training dataset class: every training sample takes `delay` seconds to 'load'."""

    delay = 0.25

    @classmethod
    def install(cls, monkeypatch):
        from conftest import patch_task

        from libreyolo.data.dataset import YOLODataset

        class Sleepy(YOLODataset):
            def __getitem__(self, key):
                if self.augment:
                    time.sleep(cls.delay)
                return super().__getitem__(key)

        patch_task(monkeypatch, "detect", dataset=Sleepy)


def test_cpu_sleeping_loader_gives_dataloader_and_try_adds_workers(tiny_data, tmp_path, monkeypatch, capsys):
    from libreyolo.cli.main import main

    SleepyDataset.install(monkeypatch)
    code = main(
        [
            "profile",
            "run",
            str(tiny_data),
            "--imgsz",
            "32",
            "--batch",
            "4",
            "--workers",
            "0",
            "--device",
            "cpu",
            "--warmup",
            "1",
            "--steps",
            "2",
            "--try",
            "--project",
            str(tmp_path),
            "nbs=4",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    before = load_profile(tmp_path / "exp")
    assert before["verdict"]["name"] == "dataloader" and before["headline"]["data_frac"] >= 0.2
    assert before["verdict"]["try"] == {"workers": 2}
    tried = json.loads((tmp_path / "exp" / "profile_try.json").read_text())
    assert tried["lever"] == {"workers": 2} and tried["after"]["img_s"]["mean"] > 0 and tried["speedup"] > 0
    assert load_profile(tmp_path / "exp" / "try")["meta"]["workers"] == 2  # the second run really used the lever
    assert "after / before" in out and "img/s" in out


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium (Debian: apt-get install chromium; .ci/run installs it)"
)


def open_headless(page: Path, profile_dir: Path) -> tuple[str, list[str]]:
    """The DOM after the page's scripts ran, and the console lines chromium logged."""
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile_dir}",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",
        "--dump-dom",
        page.as_uri(),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "<body" in r.stdout, r.stderr[-3000:]
    return r.stdout, [line for line in r.stderr.splitlines() if ":CONSOLE" in line]


def assert_page_ok(dom: str, console: list[str], verdict: str) -> None:
    assert not console, console  # no console messages at all: an uncaught error would be one
    assert 'data-state="ready"' in dom  # the script ran to its last line
    assert re.search(r'<pre id="errors" hidden="">\s*</pre>', dom), "the page reported an error"
    assert re.search(
        rf'<p id="verdict" class="[^"]*">{re.escape(html.escape(verdict))}</p>', dom
    )  # filled in by the script


@needs_chromium
def test_timeline_opens_in_a_real_browser_without_errors(profiled, tmp_path):
    dom, console = open_headless(profiled[2] / "timeline.html", tmp_path / "chromium")
    assert_page_ok(dom, console, "compute")
    assert "on cpu the step is compute" in dom and "top CPU ops" in dom


@needs_chromium
def test_gpu_lanes_render_and_a_throwing_page_is_caught(profiled, tmp_path):
    from test_profiler_analysis import synthetic_trace

    from libreyolo.profiler.analysis import slice_trace
    from libreyolo.profiler.artifacts import render_timeline, timeline_data

    p = load_profile(profiled[2])
    p["meta"]["device"], p["verdict"]["name"] = "cuda:0", "host / launch"
    data = timeline_data(slice_trace(synthetic_trace(steps=3, mallocs=2)), p)
    assert {"phases · GPU", "GPU kernels · stream 7"} <= {lane["name"] for lane in data["lanes"]}
    page = tmp_path / "timeline.html"
    page.write_text(render_timeline(data))
    dom, console = open_headless(page, tmp_path / "chromium")
    assert_page_ok(dom, console, "host / launch")
    # the check itself must be able to fail: the same page with a script that throws
    page.write_text(page.read_text().replace("</body>", "<script>null.boom;</script></body>"))
    dom, console = open_headless(page, tmp_path / "chromium2")
    assert (
        'data-state="error"' in dom
        and "Cannot read properties of null" in dom
        and any("Uncaught" in c for c in console)
    )


def test_an_epochs_checkpoint_write_is_finished_before_the_next_measured_step(tiny_data, tmp_path, monkeypatch):
    """last.pt is written in a background thread at each epoch end; inside the window that write competes with
    the next step for the CPU (and the GIL), so it is settled before that step's clock starts."""
    import libreyolo.engine.checkpoint as ckpt
    import libreyolo.profiler.window as window

    real_save = ckpt.save_atomic

    def slow_save(obj, path):
        time.sleep(0.4)
        return real_save(obj, path)

    monkeypatch.setattr(ckpt, "save_atomic", slow_save)
    seen: list[int] = []  # unfinished writes when a measured step's data phase starts its clock
    real_enter = window._Phase.__enter__

    def enter(self):
        out = real_enter(self)
        if self.name == "data" and self.w.step_open:
            seen.append(sum(not f.done() for f, _ in self.w.trainer.writer._pending))
        return out

    monkeypatch.setattr(window._Phase, "__enter__", enter)
    train_with_spy(tiny_data, tmp_path, epochs=4, nbs=4, profile=True, profile_warmup=5, profile_steps=7)
    assert len(seen) == 7 and seen == [0] * 7
