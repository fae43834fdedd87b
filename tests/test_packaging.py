"""The wheel installs only names we own: `libreyolo` and `libreyolo_console` (the repository's console/ folder).

PyPI has a distribution called `console` that installs a top-level `console` package; ours must never
write a file where it does, so both can live in one environment."""

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
OURS = {"libreyolo", "libreyolo_console"}


# installed package -> the repository folder it comes from
FOLDERS = {"libreyolo": "libreyolo", "libreyolo_console": "console", "libreyolo_console.themes": "themes"}


def _packages_in_tree() -> set[str]:
    return {
        ".".join((package, *p.parent.relative_to(ROOT / folder).parts))
        for package, folder in FOLDERS.items()
        for p in (ROOT / folder).rglob("__init__.py")
    }


def test_the_package_list_names_every_package_of_the_tree():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(cfg["packages"]) == _packages_in_tree()
    assert cfg["package-dir"] == {k: v for k, v in FOLDERS.items() if k != v}
    # the themes sit at the top of the repository (where people look for them), not inside console/
    assert len(list((ROOT / "themes").glob("*.yaml"))) >= 3 and not (ROOT / "console" / "themes").exists()
    assert cfg["package-data"]["libreyolo_console.themes"] == ["*.yaml"]
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
    # package data travels under the new name; every theme of the top-level themes/ folder is in the console
    assert "libreyolo_console/console.tcss" in files
    themes = {p.name for p in (ROOT / "themes").glob("*.yaml")}
    assert {n.removeprefix("libreyolo_console/themes/") for n in files if n.endswith(".yaml")} == themes
    assert "libreyolo_console/screens/new_run.py" in files


def test_no_file_of_ours_is_a_file_of_pypis_console(wheels):
    ours, theirs = wheels
    if theirs is None:
        pytest.skip("PyPI's `console` wheel could not be downloaded here")
    assert {n.split("/")[0] for n in _files(theirs)} == {"console"}  # the collision this guards against
    assert _files(ours) & _files(theirs) == set()


def test_the_installed_wheel_loads_its_own_themes(wheels, tmp_path):
    """Installed from the wheel and run away from the repository, the console finds its themes in itself."""
    ours, _ = wheels
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q", "--target", site, ours]
    subprocess.run(pip, check=True, capture_output=True)
    probe = (
        "import libreyolo_console.theming as t;"
        "print(t.themes_dir()); print(t.__file__); print(','.join(x.name for x in t.load_themes()))"
    )
    # -I: no PYTHONPATH, no user site, no script folder; the system site (textual, yaml) stays after ours
    code = f"import sys; sys.path.insert(0, {str(site)!r}); exec({probe!r})"
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    folder, module, names = out.stdout.splitlines()[-3:]
    assert module == f"{site}/libreyolo_console/theming.py" and folder == f"{site}/libreyolo_console/themes"
    assert len(names.split(",")) >= 3 and "libreyolo-dark" in names


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
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the venv's own installs, nothing else
    out = subprocess.run([py, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    theirs_file, ours_file, n_themes = out.stdout.splitlines()[-3:]
    assert theirs_file.startswith(site) and "/console/" in theirs_file
    assert ours_file == f"{site}/libreyolo_console/app.py"
    assert int(n_themes) >= 3


def test_themes_are_found_in_the_checkout_when_the_data_package_is_not_installed(monkeypatch, tmp_path):
    """Run from a checkout whose editable install predates the themes/ mapping (or with console/ put on the
    path by hand), `libreyolo_console.themes` does not import, or resolves to a folder without themes: the
    console then reads the repository's top-level themes/ folder."""
    import importlib.resources

    from libreyolo_console import theming

    assert theming.REPO_THEMES_DIR == ROOT / "themes"

    def not_installed(name: str) -> None:
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(importlib.resources, "files", not_installed)
    assert theming.themes_dir() == ROOT / "themes"
    assert [t.name for t in theming.load_themes()] == ["libreyolo-dark", "libreyolo-light", "libreyolo-high-contrast"]
    monkeypatch.setattr(importlib.resources, "files", lambda name: tmp_path)  # a stale, empty namespace package
    assert theming.themes_dir() == ROOT / "themes"
