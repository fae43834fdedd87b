"""The house rules docs/architecture.md states, checked: libreyolo's modules form no import circle, its top-level
modules and packages stand in layers that only import downwards, the console imports nothing of libreyolo but its
torch-free face (libreyolo.api), which loads no torch, and no module outside a family's folder names that family's
loss terms."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def import_graph(package: str = "libreyolo") -> dict[str, set[str]]:
    """module -> the package's modules it imports (every import statement, also those inside functions)."""
    files = {}
    for f in (ROOT / package).rglob("*.py"):
        name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
        files[name.removesuffix(".__init__")] = f
    edges: dict[str, set[str]] = {m: set() for m in files}
    for mod, f in files.items():
        for node in ast.walk(ast.parse(f.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = mod.split(".")
                    keep = len(parts) - node.level + (1 if f.name == "__init__.py" else 0)
                    base = ".".join(parts[:keep] + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                # a module importing its own package's __init__ is not a circle of files
                if t in files and t != mod and not mod.startswith(t + "."):
                    edges[mod].add(t)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_circle_finder_finds_a_planted_circle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(g) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_libreyolo_has_no_import_circle():
    edges = import_graph()
    assert len(edges) > 50 and edges["libreyolo.engine.trainer"]  # the walk saw the package
    assert circles(edges) == []


def _lines_outside(folder: str, pattern: re.Pattern, *others: str) -> list[str]:
    """file:line of every line of libreyolo/ and console/ outside families/<folder> (and the other families that
    have terms of the same names) that the pattern matches."""
    hits = []
    for top in ("libreyolo", "console"):
        for f in (ROOT / top).rglob("*.py"):
            if any(f"families/{name}/" in f.as_posix() for name in (folder, *others)):
                continue
            hits += [
                f"{f.relative_to(ROOT)}:{n}"
                for n, line in enumerate(f.read_text().splitlines(), 1)
                if pattern.search(line)
            ]
    return hits


def test_no_module_outside_yolo9_names_its_loss_terms():
    pattern = re.compile(r"""["']box["'],\s*["']cls["'],\s*["']dfl["']""")
    assert _lines_outside("yolo9", pattern) == []
    assert pattern.search(
        (ROOT / "libreyolo/families/yolo9/__init__.py").read_text()
    )  # the pattern does match the family's own


def test_no_module_outside_rtdetr_names_its_loss_terms():
    # any quoted "vfl" or "giou" (a generic "bbox" alone would also match unrelated code)
    pattern = re.compile(r"""["'](vfl|giou)["']""")
    assert _lines_outside("rtdetr", pattern, "dfine") == []  # D-FINE's terms include RT-DETR's
    assert pattern.search((ROOT / "libreyolo/families/rtdetr/__init__.py").read_text())


def _loaded_after(code: str, modules: set[str]) -> list[str]:
    """Which of `modules` a fresh interpreter has loaded after running `code`."""
    import subprocess
    import sys

    code += f"\nimport sys\nprint(sorted(set({sorted(modules)!r}) & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=300).stdout
    return __import__("ast").literal_eval(out.splitlines()[-1])


def test_the_family_registry_and_the_face_load_no_torch():
    """The registry (model names, keys), the training keys and the whole face (libreyolo.api) are read by --help, the
    console and every run's start without torch, torchvision (~2 s), scipy or OpenCV: each family's implementation
    is imported when it builds or trains."""
    heavy = {"torch", "torchvision", "scipy", "cv2"}
    assert _loaded_after("from libreyolo.families import families\nfamilies()", heavy) == []
    code = (
        "import libreyolo.api as a\na.model_names()\na.TrainConfig.spec()\na.parse_kv(['model=LibreYOLOXs', 'box=2'])"
    )
    assert _loaded_after(code, heavy) == []


# libreyolo's top-level modules and packages, bottom layer first: a unit imports only from its own layer or below
LAYERS = (
    {"errors", "keys", "tasks", "eta", "forked", "atomic"},
    {"events", "runs", "render", "tblog", "nn", "amp", "data", "distributed", "gpuprocs", "sources"},
    {"families"},
    {"config"},
    {"eval", "predict", "predict_cls"},
    {"tasks.impl", "plots"},
    {"engine"},
    {"oom", "profiler", "launch", "val", "trackers", "weights", "export"},
    {"model"},
    {"bench", "cli", "api"},
)
# a task's folder holds its description (tasks/<name>/__init__.py, torch-free, at the bottom: the events name tasks) and
# its implementation (tasks/<name>/impl.py, tasks/base.py), which wires the task's data, validation and predict
# output together for the engine
TASK_IMPL = "tasks.impl"
# libreyolo/__init__.py hands on LibreYOLO lazily (libreyolo.model, on first access) and the version; `from libreyolo
# import LibreYOLO` is an import of the model
PACKAGE_NAMES = {"__version__": "errors", "LibreYOLO": "model"}


def unit_graph() -> dict[str, dict[str, list[str]]]:
    """top-level unit -> the units it imports -> the files that do (every import, also those inside functions)."""
    out: dict[str, dict[str, list[str]]] = {}
    for f in (ROOT / "libreyolo").rglob("*.py"):
        rel = f.relative_to(ROOT / "libreyolo").with_suffix("").parts
        if rel == ("__init__",):
            continue
        src = TASK_IMPL if rel[0] == "tasks" and rel[-1] in ("impl", "base") else rel[0]
        tree = ast.parse(f.read_text())
        # imports for annotations only (under `if TYPE_CHECKING:`) are not dependencies at run time
        typing_only = {
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
            for n in ast.walk(block)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            mods: list[str] = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [f"libreyolo.{a.name}" for a in node.names] if node.module == "libreyolo" else [node.module]
            for m in mods:
                parts = m.split(".")
                if parts[0] != "libreyolo" or len(parts) < 2:
                    continue
                dst = PACKAGE_NAMES.get(parts[1], parts[1])
                if dst == "tasks" and parts[-1] in ("impl", "base"):
                    dst = TASK_IMPL
                if dst != src:
                    out.setdefault(src, {}).setdefault(dst, []).append(str(f.relative_to(ROOT)))
    return out


def test_top_level_units_import_only_downwards_and_form_no_circle():
    layer = {u: i for i, units in enumerate(LAYERS) for u in units}
    graph = unit_graph()
    assert "eval" in graph["engine"] and "model" in graph["cli"]  # the walk saw the imports
    unplaced = sorted(set(graph) - set(layer))
    assert not unplaced, f"place these in LAYERS: {unplaced}"
    upward = [
        f"{src} (layer {layer[src]}) imports {dst} (layer {layer.get(dst)}) in {files[0]}"
        for src, deps in graph.items()
        for dst, files in deps.items()
        if layer.get(dst, len(LAYERS)) > layer[src]
    ]
    assert upward == []
    assert circles({u: set(d) for u, d in graph.items()} | {u: set() for u in layer if u not in graph}) == []
    # the face is for what runs outside the library: nothing inside it leans on it
    assert not [src for src, deps in graph.items() if "api" in deps]


def test_the_console_imports_only_the_face():
    found = []
    for f in (ROOT / "console").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found += [
                f"{f.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "libreyolo" and n != "libreyolo.api"
            ]
    assert found == []
