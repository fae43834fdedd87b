"""The house rules ARCHITECTURE.md states, checked: libreyolo's modules form no import circle, and no module
outside a family's folder names that family's loss terms."""

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


def _lines_outside(folder: str, pattern: re.Pattern) -> list[str]:
    """file:line of every line of libreyolo/ and console/ outside families/<folder> that the pattern matches."""
    hits = []
    for top in ("libreyolo", "console"):
        for f in (ROOT / top).rglob("*.py"):
            if f"families/{folder}" in f.as_posix():
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
    assert _lines_outside("rtdetr", pattern) == []
    assert pattern.search((ROOT / "libreyolo/families/rtdetr/__init__.py").read_text())


def test_the_family_registry_imports_neither_torchvision_nor_scipy():
    """Every run loads the registry (model names, keys); torchvision (~2 s) and scipy are imported only by the
    families that use them, when they build or match."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom libreyolo.families import families\nfamilies()\n"
        "print(sorted({'torchvision', 'scipy'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=300).stdout
    assert out.split()[-1] == "[]", out
