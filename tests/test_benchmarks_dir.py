"""benchmarks/ holds only listed, maintained files, and docs/performance.md names only commands that exist:
every file in benchmarks/ is in its README's table, every `libreyolo bench X` the page (or the README) names is a
subcommand in libreyolo.cli.bench.BENCHES, and every `benchmarks/<file>` they name is there."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from libreyolo.cli.bench import BENCHES

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "benchmarks"
README = BENCH_DIR / "README.md"
PAGE = ROOT / "docs" / "performance.md"

# `libreyolo bench X`, also as the module form `-m libreyolo.cli.main bench X`
BENCH_CMD = re.compile(r"libreyolo(?:\.cli\.main)?\s+bench\s+([A-Za-z_][\w-]*)")
# a file named under benchmarks/ (a folder name alone, "benchmarks/", names nothing)
BENCH_FILE = re.compile(r"benchmarks/([\w.-]+)")
# the README's table: a row's first cell, `name`
README_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|", re.M)


def bench_names(text: str) -> list[str]:
    return BENCH_CMD.findall(text)


def file_refs(text: str) -> set[str]:
    return {m.rstrip(".") for m in BENCH_FILE.findall(text) if m.rstrip(".")}


def listed(readme_text: str) -> set[str]:
    return set(README_ROW.findall(readme_text))


def test_the_patterns_find_what_they_are_for():
    text = (
        "run `libreyolo bench race data=x` or `python -m libreyolo.cli.main bench step model=y`, then\n"
        "`libreyolo bench\nval`; `python benchmarks/race_ab.py --tree a=.` and benchmarks/make_data.sh. "
        "Setup: benchmarks/device_setup.sh."
    )
    assert bench_names(text) == ["race", "step", "val"]
    assert file_refs(text) == {"race_ab.py", "make_data.sh", "device_setup.sh"}
    assert listed("| file | what |\n| --- | --- |\n| `a.py` | x |\n| `b.sh` | y |\n") == {"a.py", "b.sh"}


def test_every_file_in_benchmarks_is_listed_in_its_readme_and_every_listed_file_exists():
    files = {p.name for p in BENCH_DIR.iterdir() if p.is_file()}
    rows = listed(README.read_text())
    assert not files - rows, f"benchmarks/ files missing from benchmarks/README.md: {sorted(files - rows)}"
    assert not rows - files, f"benchmarks/README.md lists files that are not there: {sorted(rows - files)}"
    assert not [p.name for p in BENCH_DIR.iterdir() if p.is_dir() and p.name != "__pycache__"], "no folders in it"


@pytest.mark.parametrize("doc", [PAGE, README], ids=["docs/performance.md", "benchmarks/README.md"])
def test_every_libreyolo_bench_command_named_is_a_real_subcommand(doc):
    names = bench_names(doc.read_text())
    assert names, f"{doc.name} names no `libreyolo bench` command"
    assert not [n for n in names if n not in BENCHES], f"not in libreyolo.cli.bench.BENCHES ({', '.join(BENCHES)})"


@pytest.mark.parametrize("doc", [PAGE, README], ids=["docs/performance.md", "benchmarks/README.md"])
def test_every_benchmarks_file_named_exists(doc):
    missing = sorted(f for f in file_refs(doc.read_text()) if not (BENCH_DIR / f).is_file())
    assert not missing, f"{doc.name} names benchmarks/ files that do not exist: {missing}"


def test_the_page_links_the_archive_and_the_archive_says_what_it_is():
    page = PAGE.read_text()
    assert page.count("(performance-archive.md)") == 1
    head = (ROOT / "docs" / "performance-archive.md").read_text()[:1000]
    assert "dated archive" in head and "removed" in head


def _race_ab():
    spec = importlib.util.spec_from_file_location("race_ab", BENCH_DIR / "race_ab.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_race_ab_runs_each_trees_own_bench_race_as_json():
    ab = _race_ab()
    cmd = ab.race_command(Path("/tmp/p/new0"), ["data=d.yaml", "epochs=15"])
    assert cmd[:6] == [sys.executable, "-m", "libreyolo.cli.main", "bench", "race", "data=d.yaml"]
    assert cmd[-2:] == ["project=/tmp/p/new0", "json=true"] and cmd[4] in BENCHES
    runs = [
        {"tree": "new", "rc": 0, "mode_asked": "auto", "wall_s": 26.0, "map50_95": 0.99},
        {"tree": "old", "rc": 0, "mode_asked": "auto", "wall_s": 28.0, "map50_95": 0.99},
        {"tree": "old", "rc": 1, "error": "boom"},
    ]
    table = ab.table(runs)
    assert "| new | 26 (mean 26) |" in table and "| old (1 failed) | 28 (mean 28) |" in table


def test_race_ab_refuses_a_tree_without_bench_race_and_keys_it_sets_itself(tmp_path):
    ab = _race_ab()
    with pytest.raises(SystemExit):
        ab.main(["--tree", f"x={tmp_path}", "--out", str(tmp_path / "o.jsonl"), "--", "data=d.yaml"])
    with pytest.raises(SystemExit):
        ab.main(["--tree", f"new={ROOT}", "--out", str(tmp_path / "o.jsonl"), "--", "data=d.yaml", "json=true"])
    assert not (tmp_path / "o.jsonl").exists()
