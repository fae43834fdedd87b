"""The wheel installs only names we own: `libreyolo` and `libreyolo_console` (the repository's console/ folder).

PyPI has a distribution called `console` that installs a top-level `console` package; ours must never
write a file where it does, so both can live in one environment."""

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
OURS = {"libreyolo", "libreyolo_console"}


def _packages_in_tree() -> set[str]:
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "libreyolo").rglob("__init__.py")}
    found |= {
        ".".join(("libreyolo_console",) + p.parent.relative_to(ROOT / "console").parts)
        for p in (ROOT / "console").rglob("__init__.py")
    }
    return found


def test_the_package_list_names_every_package_of_the_tree():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(cfg["packages"]) == _packages_in_tree()
    assert cfg["package-dir"] == {"libreyolo_console": "console"}
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["libreyolo-console"] == "libreyolo_console.app:main"


def _build(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q", "-w", str(dest)]
    subprocess.run(cmd, check=True, capture_output=True)
    return next(dest.glob("libreyolo-*.whl"))


def _download_pypi_console(dest: Path) -> Path | None:
    cmd = [sys.executable, "-m", "pip", "download", "console", "--no-deps", "-q", "-d", str(dest)]
    if subprocess.run(cmd, capture_output=True).returncode != 0:
        return None
    return next(dest.glob("console-*.whl"), None)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> tuple[Path, Path | None]:
    d = tmp_path_factory.mktemp("wheels")
    return _build(d / "ours"), _download_pypi_console(d / "pypi")


def _files(wheel: Path) -> set[str]:
    return {n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n}


def test_the_wheel_installs_only_our_top_level_names(wheels):
    ours, _ = wheels
    files = _files(ours)
    assert {n.split("/")[0] for n in files} == OURS
    # package data travels under the new name
    assert "libreyolo_console/console.tcss" in files
    assert any(n.startswith("libreyolo_console/themes/") and n.endswith(".yaml") for n in files)
    assert "libreyolo_console/screens/new_run.py" in files


def test_no_file_of_ours_is_a_file_of_pypis_console(wheels):
    ours, theirs = wheels
    if theirs is None:
        pytest.skip("PyPI's `console` wheel could not be downloaded here")
    assert {n.split("/")[0] for n in _files(theirs)} == {"console"}  # the collision this guards against
    assert _files(ours) & _files(theirs) == set()


@pytest.mark.slow
def test_both_install_into_one_environment_and_each_imports_its_own(wheels, tmp_path):
    ours, theirs = wheels
    if theirs is None:
        pytest.skip("PyPI's `console` wheel could not be downloaded here")
    env = tmp_path / "venv"
    # system site packages give torch/textual; the venv's own site-packages come first on sys.path
    venv.create(env, system_site_packages=True, with_pip=False)
    py = env / "bin" / "python"
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    for wheel in (theirs, ours):
        pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q", "--target", site, str(wheel)]
        subprocess.run(pip, check=True, capture_output=True)
    probe = (
        "import console, libreyolo_console.app as app, libreyolo_console.theming as t;"
        "print(console.__file__); print(app.__file__); print(len(t.load_themes()))"
    )
    out = subprocess.run([py, "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    theirs_file, ours_file, n_themes = out.stdout.splitlines()[-3:]
    assert theirs_file.startswith(site) and "/console/" in theirs_file
    assert ours_file == f"{site}/libreyolo_console/app.py"
    assert int(n_themes) >= 3
