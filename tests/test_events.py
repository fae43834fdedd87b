import dataclasses
import json
import re
from pathlib import Path

import pytest

from libreyolo import events as ev

DOC = (Path(__file__).resolve().parents[1] / "docs" / "events.md").read_text()


def _doc_tables() -> dict[str, dict[str, str]]:
    """heading -> {field: documented type} from docs/events.md."""
    out, current = {}, None
    for line in DOC.splitlines():
        m = re.match(r"^### `(\w+)`", line)
        if m:
            current = out.setdefault(m.group(1), {})
            continue
        m = re.match(r"^\| `(\w+)` \| ([^|]+) \|", line)
        if m and current is not None:
            current[m.group(1)] = m.group(2).strip()
    return out


def _norm(annotation: str) -> set[str]:
    return {a.strip().split("[")[0].replace("None", "null") for a in annotation.replace(" or ", "|").split("|")}


def test_every_event_and_field_is_documented_with_its_type():
    tables = _doc_tables()
    assert set(tables) == set(ev.EVENT_TYPES)
    for name, cls in ev.EVENT_TYPES.items():
        fields = {f.name: str(f.type) for f in dataclasses.fields(cls) if f.name != "t"}
        assert set(tables[name]) == set(fields), name
        for f, ann in fields.items():
            assert _norm(tables[name][f]) == _norm(ann), (name, f, tables[name][f], ann)


def test_validate_rejects_wrong_shapes():
    good = ev.Heartbeat(epoch=1, step=2, pid=3).to_dict()
    ev.validate_event(json.loads(json.dumps(good)))
    for bad in (
        {**good, "epoch": "1"},
        {k: v for k, v in good.items() if k != "pid"},
        {**good, "extra": 1},
        {**good, "v": 99},
        {**good, "type": "nope"},
    ):
        with pytest.raises(ValueError):
            ev.validate_event(bad)


def test_reader_leaves_a_partial_last_line(tmp_path):
    p = tmp_path / "events.jsonl"
    w = ev.EventWriter(p)
    w.write(ev.WarningEvent("a"))
    w.close()
    with open(p, "a") as f:
        f.write('{"type": "warn')
    assert [e["message"] for e in ev.read_events(p)] == ["a"]
