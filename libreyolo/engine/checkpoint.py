"""Checkpoints: plain dicts of tensors and builtins, written atomically, loaded without executing code."""

from __future__ import annotations

import glob
import os
import pickle
import re
import zipfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from pathlib import Path
from typing import Any

import torch

from libreyolo.engine.snapshot import PACKED, Amended, Snapshot, unpack
from libreyolo.errors import CheckpointError

FORMAT = "libreyolo.checkpoint/v1"


def save_atomic(obj: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write to a temporary file in the same folder, fsync, then rename: a reader (or a kill -9) never
    sees a half-written checkpoint."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(_temporary_name(path.name, os.getpid()))
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def _temporary_name(name: str, pid: int) -> str:
    """save_atomic's name for the file it writes before renaming it to `name`; _TEMPORARY reads the pid back."""
    return f".{name}.{pid}.tmp"


_TEMPORARY = re.compile(r"^\..+\.(\d+)\.tmp$")


def remove_stale_temporaries(folder: str | os.PathLike[str]) -> list[str]:
    """Remove the temporary files save_atomic left in folder when the process writing them was killed mid-write
    (kill -9, a lost machine): never a checkpoint, only its unfinished copy. A file whose writer (the pid in its
    name) is still running is left alone. -> the names removed."""
    removed = []
    for path in sorted(Path(folder).glob(".*.tmp")):
        m = _TEMPORARY.match(path.name)
        if m is None or _running(int(m.group(1))):
            continue
        try:
            path.unlink()
        except FileNotFoundError:  # removed by another process meanwhile
            continue
        removed.append(path.name)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only whether the process exists (this one's included)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def _write(record: dict[str, Any] | Snapshot | Amended, path: Path) -> Path:
    return save_atomic(record.resolve() if isinstance(record, (Snapshot, Amended)) else record, path)


class CheckpointWriter:
    """Writes checkpoints on one background thread, in the order they were asked for, so that the training
    loop does not wait for serialisation and fsync (they took 0.6-0.8 s of every epoch's last.pt +
    best.pt in the training thread on the H200 machine). Records are snapshots (engine/snapshot.py) or plain
    CPU records. `drain()` runs in the training thread: it reports the writes that finished and raises a write's
    error there, so a full disk still stops the run."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="libreyolo-checkpoint")
        self._pending: list[tuple[Future[Path], Callable[[Path], None]]] = []

    def submit(self, record: dict[str, Any] | Snapshot | Amended, path: Path, on_done: Callable[[Path], None]) -> None:
        self._pending.append((self._pool.submit(_write, record, path), on_done))

    def drain(self, wait: bool = False) -> None:
        if wait:
            wait_all([f for f, _ in self._pending])
        finished: list[tuple[Future[Path], Callable[[Path], None]]] = []
        pending: list[tuple[Future[Path], Callable[[Path], None]]] = []
        for p in self._pending:  # done() asked once per write: one finishing meanwhile must land in one list
            (finished if p[0].done() else pending).append(p)
        self._pending = pending
        for future, on_done in finished:
            on_done(future.result())

    def close(self) -> None:
        try:
            self.drain(wait=True)
        finally:
            self._pool.shutdown(wait=True)


def load_weights(module: torch.nn.Module, state: dict[str, torch.Tensor], what: str = "weights") -> None:
    """load_state_dict that ignores BatchNorm's num_batches_tracked (our BN layers do not keep one; torch
    re-adds the key when a state dict carries no version metadata) and reports any other mismatch."""
    missing, unexpected = module.load_state_dict(state, strict=False)
    unexpected = [k for k in unexpected if not k.endswith("num_batches_tracked")]
    if missing or unexpected:
        raise CheckpointError(f"{what} do not fit the network: missing {missing[:3]}, unexpected {unexpected[:3]}")


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a libreyolo checkpoint with torch.load(weights_only=True): no pickled code ever runs."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    with open(path, "rb") as f:
        head = f.read(4)
    # torch.save writes a zip archive; a pickle starts with its protocol opcode. Anything else (a yaml, a text
    # file, an image) is not a checkpoint, and torch's own errors about unpickling it would only mislead.
    if not head.startswith((b"PK\x03\x04", b"\x80")):
        yaml_hint = "; a dataset yaml goes to data=" if path.suffix in (".yaml", ".yml") else ""
        raise CheckpointError(
            f"{path} is not a libreyolo checkpoint: it is not a PyTorch file (pass the weights/last.pt or "
            f"weights/best.pt of a libreyolo run{yaml_hint})"
        )
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{path} is not a libreyolo checkpoint: loading it would execute code stored in the file (Python pickle), "
            "which libreyolo refuses to do. Only checkpoints written by libreyolo (weights/last.pt, weights/best.pt) "
            "load. "
            f"({str(e).splitlines()[0]})"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as e:
        raise CheckpointError(f"{path} is corrupt or truncated and cannot be read ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a libreyolo checkpoint (expected format {FORMAT!r})")
    train = obj.get("train")
    if isinstance(train, dict) and train.get("packed") == PACKED:
        try:
            obj["train"] = unpack(train)
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as e:
            why = f"{type(e).__name__}: {e}"
            raise CheckpointError(f"{path} is corrupt: its train state does not unpack ({why})") from None
    return obj


def best_so_far(
    best_path: Path, fitness: float | None, metrics: dict[str, float]
) -> tuple[float | None, dict[str, float]]:
    """The best fitness and metrics a resumed run starts from: a last.pt's, or its run's best.pt's if higher. An
    epoch's validation lands during the next epoch, after that epoch's last.pt, so a crash can leave a best.pt
    better than the last.pt recorded, which a worse epoch must not overwrite after resuming."""
    if best_path.is_file():
        best = load_checkpoint(best_path)
        if best.get("best_fitness") is not None and (fitness is None or best["best_fitness"] > fitness):
            return best["best_fitness"], dict(best.get("metrics") or {})
    return fitness, metrics


def resolve_resume_path(cfg: Any) -> Path:
    if isinstance(cfg.resume, str):
        return Path(cfg.resume)
    if cfg.model.endswith(".pt") and Path(cfg.model).name == "last.pt":
        return Path(cfg.model)
    runs = sorted(glob.glob(str(Path(cfg.project) / "*" / "weights" / "last.pt")), key=os.path.getmtime)
    if not runs:
        raise CheckpointError(f"resume=true but no {cfg.project}/*/weights/last.pt exists; pass resume=path/to/last.pt")
    return Path(runs[-1])
