"""benchmarks/sizes_vs.py: what it runs per spec, the rows it writes, and the table docs/performance.md takes."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "sizes_vs.py"


@pytest.fixture(scope="module")
def sv():
    # the script imports libreyolo16_families from its own folder, which is on the path when it runs as a script
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("sizes_vs", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


def test_each_spec_runs_ours_then_16_then_ultralytics_for_yolov9_only(sv, tmp_path):
    ns = sv.argparse.Namespace(
        libs={"ours", "ly16", "ultralytics"}, ly16=tmp_path / "ly16", ul=tmp_path / "ul", imgsz=640, steps=24,
        warmup=6, device="cuda:0",
    )  # fmt: skip
    runs = sv.commands("yolo9:m:32", ns)
    assert [lib for lib, _, _ in runs] == ["ours", "ly16", "ultralytics"]
    ours = runs[0][1]
    assert ours[:3] == ["libreyolo", "bench", "step"] and "model=LibreYOLO9m" in ours and "batch=32" in ours
    assert "modes=eager,full" in ours and "device=0" in ours
    assert runs[2][1][runs[2][1].index("--model") + 1] == "yolov9m.yaml"
    assert runs[2][2]["PYTHONPATH"].split(":")[0] == str(tmp_path / "ul")
    # RT-DETR: its auto mode is the network graph, and Ultralytics has no RT-DETR of this kind here
    runs = sv.commands("rtdetr:r50:8", ns)
    assert [lib for lib, _, _ in runs] == ["ours", "ly16"] and "modes=eager,graph" in runs[0][1]
    with pytest.raises(SystemExit, match="family 'yolo11' is not one of yolo9, yolox, rtdetr"):
        sv.commands("yolo11:n:8", ns)


def test_a_missing_library_folder_is_named(sv, tmp_path):
    with pytest.raises(SystemExit, match="--libs has ly16 but its folder"):
        sv.main(["--out", str(tmp_path / "r.jsonl"), "--libs", "ours,ly16", "yolox:n:8"])


def test_rows_of_ours_on_the_cpu_and_what_the_budget_skips(sv, tmp_path):
    out = tmp_path / "rows.jsonl"
    sv.main(["--libs", "ours", "--device", "cpu", "--imgsz", "64", "--out", str(out), "yolox:n:2"])
    sv.main(["--libs", "ours", "--budget", "0", "--out", str(out), "yolox:t:2"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["lib"], r["spec"]) for r in rows] == [("ours", "yolox:n:2"), ("ours", "yolox:t:2")]
    modes = {m["mode"]: m for m in rows[0]["row"]["results"]}
    assert set(modes) == {"eager", "full"} and rows[0]["row"]["meta"]["imgsz"] == 64
    assert rows[1] == {"lib": "ours", "spec": "yolox:t:2", "skipped": "the budget ran out"}
    table = sv.table(out, "2026-12-06", "cpu")
    assert len(table) == 1  # the skipped spec has no row
    cells = [c.strip() for c in table[0].strip("|").split("|")]
    assert cells[:3] == ["LibreYOLOXn", "-", "2"] and cells[5:] == ["-"] * 5 + ["2026-12-06", "cpu"]
    assert float(cells[3]) == round(modes["eager"]["mean_ms"], 1)


def test_the_table_orders_sizes_and_divides_by_our_default_mode(sv, tmp_path):
    def ours(spec, eager, auto, mode="full"):
        results = [{"mode": "eager", "mean_ms": eager}, {"mode": mode, "mean_ms": auto}]
        return {"lib": "ours", "spec": spec, "row": {"meta": {}, "results": results}}

    def ly16(spec, mode, ms, params):
        return {"lib": "ly16", "spec": spec, "row": {"mode": mode, "mean_ms": ms, "params": params}}

    rows = [
        ours("yolo9:c:8", 40.0, 20.0),
        ly16("yolo9:c:8", "eager", 100.0, 35_621_458),
        ly16("yolo9:c:8", "graph", 80.0, 35_621_458),
        {"lib": "ultralytics", "spec": "yolo9:c:8", "row": {"mean_ms": 50.0}},
        ours("yolo9:t:8", 30.0, 10.0),
        ours("rtdetr:r101:8", 90.0, 100.0, mode="graph"),
        ours("rtdetr:r18:8", 45.0, 40.0, mode="graph"),
        {"lib": "ly16", "spec": "rtdetr:r18:8", "row": {"mode": "graph", "skipped": "1.6's graph needs CUDA"}},
        {"lib": "ly16", "spec": "yolo9:t:8", "rc": 1, "error": "Traceback"},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = sv.table(path, "2026-12-06", "H200")
    first = [line.split(" | ")[0].strip("| ") for line in table]
    assert first == ["LibreYOLO9t", "LibreYOLO9c", "LibreRTDETRr18", "LibreRTDETRr101"]
    c = [x.strip() for x in table[1].strip("|").split("|")]
    # 1.6's faster mode (80) and Ultralytics (50) over our auto mode (20), never over our eager step
    assert c == [
        "LibreYOLO9c",
        "35.6M",
        "8",
        "40.0",
        "20.0",
        "100.0",
        "80.0",
        "50.0",
        "4.0x",
        "2.5x",
        "2026-12-06",
        "H200",
    ]
    assert [x.strip() for x in table[3].strip("|").split("|")][3:5] == ["90.0", "100.0"]
