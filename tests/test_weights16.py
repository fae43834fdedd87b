"""LibreYOLO 1.6's checkpoints load here and compute what 1.6 computes: 1.6 (from PyPI, installed once into a
folder of its own and run in a subprocess, since it is also named `libreyolo`) builds a randomly initialised
model, saves it (.pt as 1.6 saves, and its weights as .safetensors) and writes its raw head outputs and
post-processed boxes for a fixed input; this project loads the files and must give the same raw outputs (within
1e-4, float32, eval mode) and the same boxes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.errors import CheckpointError

VERSION = "1.6.0"
REF_SCRIPT = Path(__file__).with_name("weights_ref16.py")
# what importing 1.6's YOLOv9 and YOLOX models needs beyond this project's own dependencies
EXTRA = ("tqdm",)


@pytest.fixture(scope="session")
def libreyolo16() -> Path:
    """The folder LibreYOLO 1.6 is installed in: pip --target, once per machine, in the user's cache (not the
    test session's private one, which is new each session), built aside and renamed when complete."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "libreyolo-reference"
    # LIBREYOLO16_DIR: a folder installed elsewhere (pip install --no-deps --target DIR libreyolo==1.6.0 tqdm),
    # carried to a machine without a network
    folder = Path(os.environ.get("LIBREYOLO16_DIR") or root / f"libreyolo-{VERSION}")
    if not folder.is_dir():
        aside = root / f".libreyolo-{VERSION}.{os.getpid()}"
        shutil.rmtree(aside, ignore_errors=True)
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(aside)]
        got = subprocess.run([*cmd, f"libreyolo=={VERSION}", *EXTRA], capture_output=True, text=True, timeout=600)
        if got.returncode != 0:
            shutil.rmtree(aside, ignore_errors=True)
            pytest.skip(f"libreyolo=={VERSION} could not be installed from PyPI: {got.stderr.strip()[-300:]}")
        try:
            aside.rename(folder)
        except OSError:  # another session installed it meanwhile
            shutil.rmtree(aside, ignore_errors=True)
    # 1.6 also imports requests and opencv, which this project's test environment brings (mlflow's client, the
    # loaders): where one is missing, say which instead of failing every test on it
    probe = "from libreyolo import LibreYOLO9, LibreYOLOX, LibreResNet; import safetensors"
    env = {**os.environ, "PYTHONPATH": str(folder)}
    got = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=folder, timeout=300
    )
    if got.returncode != 0:
        pytest.skip(f"libreyolo=={VERSION} is installed but does not import: {got.stderr.strip().splitlines()[-1]}")
    return folder


def reference(
    folder: Path,
    family: str,
    size: str,
    nc: int,
    out: Path,
    device: str = "cpu",
    dtype: str = "float32",
    px: int = 64,
) -> dict[str, torch.Tensor]:
    """Run 1.6 on a fixed input (two px x px images, RGB in 0..1) and return its outputs; its files land in out."""
    return run_reference(REF_SCRIPT, folder, [family, size, str(nc), str(out), device, dtype], out, px)


def run_reference(script: Path, folder: Path, args: list[str], out: Path, px: int = 64) -> dict[str, torch.Tensor]:
    """A reference script of tests/ run with 1.6 (in `folder`) on the fixed input it finds in out/x.pt; -> what it
    saved in out/reference.pt."""
    torch.save(torch.rand(2, 3, px, px, generator=torch.Generator().manual_seed(3)), out / "x.pt")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(folder), str(script.parent)))}
    got = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=300, env=env, cwd=out
    )
    assert got.returncode == 0, got.stderr[-2000:]
    return torch.load(out / "reference.pt", weights_only=True)


def outputs(model: LibreYOLO, x: torch.Tensor, multi_label: bool) -> tuple[torch.Tensor, torch.Tensor]:
    net = model.net.eval()
    with torch.no_grad():
        raw = net(x)
    first = tuple(r[:1] for r in raw) if isinstance(raw, tuple) else raw[:1]
    return raw, model.family.postprocess(net, first, (x.shape[-2], x.shape[-1]), 0.001, 0.7, 50, multi_label)


def assert_same_queries(ours: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...]) -> None:
    """A DETR's raw outputs (logits, boxes: B x queries x ...) within 1e-4, queries compared as a set: the decoder
    takes its queries in the order of a top-k over encoder scores, and scores that tie to the last float bit (a
    different summation order) come in either order. Each query of ours is paired with the nearest of theirs by
    Hungarian matching (scipy) over the whole row; the pairing must be one-to-one, and the rows then match."""
    from scipy.optimize import linear_sum_assignment

    rows = torch.cat(ours, -1)
    ref = torch.cat(theirs, -1)
    assert rows.shape == ref.shape
    for b in range(rows.shape[0]):
        mine, order = map(torch.as_tensor, linear_sum_assignment(torch.cdist(rows[b], ref[b], p=1).numpy()))
        torch.testing.assert_close(rows[b][mine], ref[b][order], atol=1e-4, rtol=0)
        moved = int((order != mine).sum())
        assert moved <= rows.shape[1] // 10, f"image {b}: {moved} queries out of place, more than ties would explain"


def assert_same_boxes(ours: torch.Tensor, ref: dict[str, torch.Tensor]) -> None:
    """The same detections: compared as sets (rows ordered by class and corner), since boxes whose scores differ
    in the last float bits may come in either order."""
    assert len(ref["boxes"]) > 0, "the reference kept no box: the comparison would prove nothing"
    theirs = torch.cat((ref["classes"][:, None], ref["boxes"], ref["scores"][:, None]), 1)
    mine = torch.cat((ours[:, 6:7], ours[:, 1:6]), 1)
    assert mine.shape == theirs.shape

    def ordered(rows: torch.Tensor) -> torch.Tensor:
        keys = [tuple(round(v, 2) for v in r) for r in rows.tolist()]
        return rows[sorted(range(len(keys)), key=keys.__getitem__)]

    torch.testing.assert_close(ordered(mine), ordered(theirs), atol=1e-3, rtol=0)


@pytest.mark.parametrize(("family", "size", "multi_label"), [("yolox", "n", False), ("yolo9", "m", True)])
def test_libreyolo16_checkpoint_gives_its_outputs(libreyolo16, tmp_path, family, size, multi_label):
    ref = reference(libreyolo16, family, size, 3, tmp_path)
    x = torch.load(tmp_path / "x.pt", weights_only=True)
    for suffix in (".pt", ".safetensors"):
        model = LibreYOLO(tmp_path / f"libreyolo16_{family}{size}{suffix}")
        assert model.family.name == family and model.size == size and model.nc == 3
        assert model.loaded_note.startswith("read ") and "LibreYOLO" in model.loaded_note
        raw, boxes = outputs(model, x, multi_label)
        torch.testing.assert_close(raw, ref["raw"], atol=1e-4, rtol=0)
        assert_same_boxes(boxes, ref)
    assert model.names == ["class0", "class1", "class2"]  # a .safetensors carries no names
    model = LibreYOLO(tmp_path / f"libreyolo16_{family}{size}.pt")  # the .pt carries them, and its image size
    assert model.names == ["class_0", "class_1", "class_2"] and model.imgsz == (416 if family == "yolox" else 640)
    again = LibreYOLO(model.save(tmp_path / "own.pt"))  # saved here, it is this project's checkpoint
    assert again.loaded_note == "" and again.model_name == model.model_name


def test_libreyolo16_yolo9_t_and_mobilenetv4_s_are_refused_with_the_reason(libreyolo16, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(libreyolo16)}
    code = (
        "import sys; from libreyolo import LibreYOLO9, LibreMobileNetV4; "
        "LibreYOLO9(None, size='t', nb_classes=3, device='cpu').save(sys.argv[1] + '/t.pt'); "
        "LibreMobileNetV4(None, size='s', nb_classes=3, device='cpu').save(sys.argv[1] + '/s.pt')"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, env=env, cwd=tmp_path)
    with pytest.raises(CheckpointError, match="AConv downsamplers"):
        LibreYOLO(tmp_path / "t.pt")
    with pytest.raises(CheckpointError, match="MobileNetV4-Conv-S starts with plain conv-BN-ReLU"):
        LibreYOLO(tmp_path / "s.pt")


def test_libreyolo16_resnet_checkpoint_gives_its_logits(libreyolo16, tmp_path):
    ref = reference(libreyolo16, "resnet", "18", 4, tmp_path)
    x = torch.load(tmp_path / "x.pt", weights_only=True)
    model = LibreYOLO(tmp_path / "libreyolo16_resnet18.pt")
    assert model.model_name == "LibreResNet18" and model.names == ["class_0", "class_1", "class_2", "class_3"]
    assert "LibreYOLO 1.6 ResNet checkpoint" in model.loaded_note
    with torch.no_grad():
        torch.testing.assert_close(model.net.eval()(x), ref["raw"], atol=1e-4, rtol=0)


def test_libreyolo16_mobilenetv4_m_gives_its_logits(libreyolo16, tmp_path):
    ref = reference(libreyolo16, "mnv4", "m", 4, tmp_path)
    x = torch.load(tmp_path / "x.pt", weights_only=True)
    model = LibreYOLO(tmp_path / "libreyolo16_mnv4m.pt")
    assert model.model_name == "LibreMNv4m" and "MobileNetV4-Conv" in model.loaded_note
    with torch.no_grad():
        torch.testing.assert_close(model.net.eval()(x), ref["raw"], atol=1e-4, rtol=0)


def test_libreyolo16_and_official_rtdetr_files_give_its_outputs(libreyolo16, tmp_path):
    """1.6's RT-DETR keeps the official layout: its .pt, its .safetensors and an official-style .pth (the EMA
    weights preferred, as the release's tools do, over the raw ones, zeroed here) give 1.6's outputs. 160 px:
    the official decoder takes its 300 queries from at least 300 encoder tokens."""
    ref = reference(libreyolo16, "rtdetr", "r18", 3, tmp_path, px=160)
    x = torch.load(tmp_path / "x.pt", weights_only=True)
    from safetensors.torch import load_file

    state = load_file(tmp_path / "libreyolo16_rtdetrr18.safetensors")
    official = tmp_path / "rtdetr_r18vd_dec3_6x_coco.pth"
    torch.save({"last_epoch": 71, "model": {k: v * 0 for k, v in state.items()}, "ema": {"module": state}}, official)
    for path in (tmp_path / "libreyolo16_rtdetrr18.pt", tmp_path / "libreyolo16_rtdetrr18.safetensors", official):
        model = LibreYOLO(path)
        assert model.model_name == "LibreRTDETRr18" and model.nc == 3
        assert ("official layout" in model.loaded_note) == (path.suffix != ".pt"), model.loaded_note
        raw, boxes = outputs(model, x, multi_label=True)
        assert_same_queries(raw, ref["raw"])
        assert_same_boxes(boxes, ref)
