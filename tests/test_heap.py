"""The garbage collector through a run: held through the start, a frozen heap for the epochs, as before after."""

import gc
import sys
import types

from conftest import FAST

from libreyolo import LibreYOLO
from libreyolo.cli import main as cli_main
from libreyolo.engine.heap import frozen_heap, held_collections


def test_a_run_holds_collections_through_its_start_and_freezes_the_heap_for_its_epochs(tiny_data, tmp_path):
    assert gc.isenabled() and gc.get_freeze_count() == 0
    seen: list[tuple[str, bool, bool]] = []
    record = lambda e: seen.append((e.type, gc.isenabled(), gc.get_freeze_count() > 0))  # noqa: E731
    m = LibreYOLO("LibreYOLO9t")
    m.train(**{**FAST, "data": str(tiny_data), "project": str(tmp_path), "epochs": 2, "callbacks": [record]})
    state = {t: (enabled, frozen) for t, enabled, frozen in seen}
    assert state["run_start"] == (False, False)  # emitted after the setup, before the epochs
    assert {(enabled, frozen) for t, enabled, frozen in seen if t == "step"} == {(True, True)}
    assert gc.isenabled() and gc.get_freeze_count() == 0  # the caller's collector as it was


def test_the_heap_is_frozen_only_inside_and_the_callers_settings_come_back():
    gc.disable()
    try:
        with frozen_heap():
            assert gc.isenabled() and gc.get_freeze_count() > 0
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.enable()
    gc.freeze()  # a caller that froze its heap itself
    try:
        with frozen_heap():
            pass
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    with held_collections():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_train_command_imports_and_runs_without_automatic_collections(monkeypatch):
    from libreyolo.cli import cudastart

    seen: list[bool] = []

    def run(argv: list[str]) -> int:
        seen.append(gc.isenabled())
        return 0

    fake = types.ModuleType("fake_command")
    fake.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_command", fake)
    monkeypatch.setitem(cli_main.COMMANDS, "train", ("fake_command", ""))
    monkeypatch.setitem(cli_main.COMMANDS, "data", ("fake_command", ""))
    monkeypatch.setattr(cudastart, "start", lambda argv: None)
    assert cli_main.main(["train"]) == 0 and cli_main.main(["data"]) == 0
    assert seen == [False, True] and gc.isenabled()
