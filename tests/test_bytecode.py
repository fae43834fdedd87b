"""engine/bytecode.py: the start-up note for a torch installed without its bytecode cache."""

from __future__ import annotations

import importlib.util
import py_compile
import sys

from libreyolo.engine.bytecode import uncached_bytecode_note


def _module(tmp_path, name="fakepkg"):
    pkg = tmp_path / name
    pkg.mkdir()
    src = pkg / "__init__.py"
    src.write_text("X = 1\n")
    spec = importlib.util.spec_from_file_location(name, src)
    module = importlib.util.module_from_spec(spec)
    return module, src


def test_a_module_without_bytecode_cache_gets_a_note_naming_its_folder_and_the_fix(tmp_path):
    module, src = _module(tmp_path)
    note = uncached_bytecode_note(module)
    assert note is not None and "fakepkg has no bytecode cache" in note
    assert f"-m compileall -q {src.parent}" in note
    assert ("PYTHONDONTWRITEBYTECODE" in note) == bool(sys.flags.dont_write_bytecode)


def test_no_note_once_the_cache_exists_or_without_a_source_file(tmp_path):
    module, src = _module(tmp_path)
    py_compile.compile(str(src), cfile=importlib.util.cache_from_source(str(src)), doraise=True)
    assert uncached_bytecode_note(module) is None
    module.__file__ = str(src) + "c"  # a sourceless install
    assert uncached_bytecode_note(module) is None
