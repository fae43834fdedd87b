"""console.tail: complete lines only, partial lines kept for later, truncation / rotation / rewrite detected."""

import json
import os
import threading

from libreyolo import events as ev
from libreyolo_console.tail import EventTail, LineTail, follow


def _append(path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def test_partial_last_line_is_kept_until_its_newline_arrives(tmp_path):
    p = tmp_path / "log"
    t = LineTail(p)
    assert not t.read()  # no file yet: nothing, no error
    _append(p, "one\ntw")
    assert t.read().lines == ["one"]
    assert t.read().lines == []
    _append(p, "o\nthree")
    assert t.read().lines == ["two"]
    _append(p, "\n")
    assert t.read().lines == ["three"]


def test_truncation_restarts_from_the_beginning_and_says_so(tmp_path):
    p = tmp_path / "log"
    p.write_text("a\nb\nc\n")
    t = LineTail(p)
    assert t.read().lines == ["a", "b", "c"]
    p.write_text("x\n")  # shorter than what was read
    got = t.read()
    assert got.reset and got.lines == ["x"]


def test_rewrite_past_the_offset_between_two_polls_is_detected(tmp_path):
    # truncated and rewritten with more bytes than before: the size alone cannot tell, the first bytes can
    p = tmp_path / "log"
    p.write_text("first run\n")
    t = LineTail(p)
    t.read()
    p.write_text("second run, longer than the first\nmore\n")
    got = t.read()
    assert got.reset and got.lines == ["second run, longer than the first", "more"]


def test_rotation_to_a_new_file_is_followed(tmp_path):
    p = tmp_path / "log"
    p.write_text("old 1\nold 2\n")
    t = LineTail(p)
    t.read()
    os.rename(p, tmp_path / "log.1")
    p.write_text("old 1\nnew\n")  # same first bytes, different inode
    got = t.read()
    assert got.reset and got.lines == ["old 1", "new"]


def test_from_end_drops_the_cut_first_line_and_reads_big_files_in_chunks(tmp_path, monkeypatch):
    import libreyolo_console.tail as tail

    p = tmp_path / "log"
    p.write_text("".join(f"line {i}\n" for i in range(1000)))
    t = LineTail(p, from_end=30)
    lines = t.read().lines
    assert lines and lines[-1] == "line 999" and all(line.startswith("line ") for line in lines)
    assert len(lines) < 5
    monkeypatch.setattr(tail, "CHUNK", 100)
    t = LineTail(p)
    first = t.read()
    assert first.more and len(first.lines) < 20
    rest = []
    while True:
        b = t.read()
        rest += b.lines
        if not b.more:
            break
    assert first.lines + rest == [f"line {i}" for i in range(1000)]


def test_event_tail_parses_events_and_rejects_unknown_versions_and_garbage(tmp_path):
    p = tmp_path / "events.jsonl"
    w = ev.EventWriter(p)
    w.write(ev.Heartbeat(epoch=0, step=3, pid=1))
    w.close()
    _append(p, "not json\n")
    _append(p, json.dumps({"type": "step", "v": 99}) + "\n")
    _append(p, '{"type": "heartbeat", "v": 1, "t": 1.0, "epoch": 0, "step": 4')  # writer mid-line
    t = EventTail(p)
    b = t.read()
    assert [e["step"] for e in b.events] == [3] and b.bad_lines == 2
    _append(p, ', "pid": 1}\n')
    assert [e["step"] for e in t.read().events] == [4]


def test_follow_delivers_from_a_thread_until_stopped(tmp_path):
    p = tmp_path / "log"
    got: list[str] = []
    stop = threading.Event()
    th = threading.Thread(target=follow, args=(LineTail(p).read, lambda b: got.extend(b.lines), stop, 0.02))
    th.start()
    try:
        _append(p, "a\nb\n")
        for _ in range(200):
            if got == ["a", "b"]:
                break
            stop.wait(0.01)
    finally:
        stop.set()
        th.join(timeout=5)
    assert got == ["a", "b"] and not th.is_alive()


def test_run_list_reads_the_first_event_and_the_end_with_the_same_rules(tmp_path, monkeypatch):
    import libreyolo_console.runs as runs

    monkeypatch.setattr(runs, "_TAIL_BYTES", 400)  # a small tail, so the file's middle is never read
    p = tmp_path / "events.jsonl"
    w = ev.EventWriter(p)
    for step in range(40):
        w.write(ev.Heartbeat(epoch=0, step=step, pid=1))
    w.close()
    _append(p, json.dumps({"type": "heartbeat", "v": 99, "step": 40}) + "\n")  # a schema this reader does not know
    _append(p, "garbage\n")
    _append(p, '{"type": "heartbeat", "v": 1, "t": 1.0, "epoch": 0, "step": 41')  # the writer is mid-line
    head, tail = runs.read_head_tail(p)
    steps = [e["step"] for e in tail]
    assert head["step"] == 0 and steps == list(range(steps[0], 40)) and 0 < steps[0] < 39
    assert runs.read_head_tail(tmp_path / "missing.jsonl") == (None, [])
