"""Checkpoints: plain dicts of tensors and builtins, written atomically, loaded without executing code."""

from __future__ import annotations

import glob
import os
import pickle
import re
import shutil
import zipfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from libreyolo.engine.snapshot import PACKED, Amended, Snapshot, unpack
from libreyolo.errors import CheckpointError, DiskFullError, disk_full_in
from libreyolo.runs import lock_run_dir, write_args

if TYPE_CHECKING:
    from libreyolo.config import TrainConfig

FORMAT = "libreyolo.checkpoint/v1"


def save_atomic(obj: dict[str, Any], path: str | os.PathLike[str], keep_previous: bool | None = None) -> Path:
    """Write to a temporary file in the same folder, fsync, then rename: a reader (or a kill -9) never sees a
    half-written checkpoint. keep_previous (by default for a last.pt): the file being replaced stays as its
    previous_of (weights/last.prev.pt beside last.pt; a hard link, renamed into place before the new file is), for a
    resume when the newest cannot be read.
    A full disk raises DiskFullError naming the file: the checkpoint already there is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(_temporary_name(path.name, os.getpid()))
    written: _Recording | None = None
    try:
        with open(tmp, "wb") as f:
            written = _Recording(f)
            torch.save(obj, written)  # type: ignore[arg-type]
            f.flush()
            os.fsync(f.fileno())
        if (path.name == "last.pt" if keep_previous is None else keep_previous) and path.exists():
            _keep(path, previous_of(path))
        os.replace(tmp, path)
        _sync_folder(path.parent)
    except Exception as e:
        if disk_full_in(e) or (written is not None and disk_full_in(written.error)):
            raise DiskFullError.at(path) from e
        raise
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


class _Recording:
    """The file torch.save writes through: torch turns an OSError of a write into a RuntimeError ('unexpected pos
    ...'), with the OSError at most in its chain: the write's own error is kept here, so a full disk is told."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return int(self._f.write(data))
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self._f.flush()


def previous_of(path: str | os.PathLike[str]) -> Path:
    """weights/last.pt -> weights/last.prev.pt: the checkpoint it replaced."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def _keep(path: Path, previous: Path) -> None:
    """previous becomes what path holds now, atomically (a hard link; a copy where the file system has none)."""
    tmp = previous.with_name(_temporary_name(previous.name, os.getpid()))
    try:
        try:
            os.link(path, tmp)
        except OSError as e:
            if disk_full_in(e):
                raise
            shutil.copyfile(path, tmp)
        os.replace(tmp, previous)
    finally:
        if tmp.exists():
            tmp.unlink()


def _sync_folder(folder: Path) -> None:
    """fsync a folder, so its renames survive a power loss (not every platform can open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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


def load_torch_file(path: Path, not_torch: str, pickled: str) -> Any:
    """torch.load(weights_only=True) of a file, every failure one CheckpointError starting with the path: not_torch
    where the file is not one torch.save writes, pickled (followed by what torch's safe loader met) where it holds
    Python objects, and a corrupt or truncated file said as such."""
    with open(path, "rb") as f:
        head = f.read(4)
    # torch.save writes a zip archive; a pickle starts with its protocol opcode. Anything else (a yaml, a text
    # file, an image) is not a checkpoint, and torch's own errors about unpickling it would only mislead.
    if not head.startswith((b"PK\x03\x04", b"\x80")):
        raise CheckpointError(f"{path} {not_torch}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{path} {pickled} ({_unpickling_reason(e)})") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as e:
        raise CheckpointError(f"{path} is corrupt or truncated and cannot be read ({type(e).__name__}: {e})") from None


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a libreyolo checkpoint with torch.load(weights_only=True): no pickled code ever runs."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    yaml_hint = "; a dataset yaml goes to data=" if path.suffix in (".yaml", ".yml") else ""
    obj = load_torch_file(
        path,
        "is not a libreyolo checkpoint: it is not a PyTorch file (pass the weights/last.pt or weights/best.pt of a "
        f"libreyolo run{yaml_hint})",
        "is not a libreyolo checkpoint: loading it would execute code stored in the file (Python pickle), which "
        "libreyolo refuses to do. Only checkpoints written by libreyolo (weights/last.pt, weights/best.pt) load.",
    )
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


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _unpickling_reason(e: BaseException) -> str:
    """What torch's safe loader met in the file (e.g. 'Trying to load unsupported GLOBAL posix.system ...'),
    without its advice to load with weights_only=False, which libreyolo refuses, and without terminal colour codes."""
    lines = [_ANSI.sub("", line).strip() for line in str(e).splitlines()]
    kept = [x for x in lines if x and "weights_only" not in x and "torch.load" not in x and "Weights only" not in x]
    return kept[0] if kept else "it holds objects that are not tensors or plain values"


def best_so_far(
    best_path: Path, fitness: float | None, metrics: dict[str, float]
) -> tuple[float | None, dict[str, float]]:
    """The best fitness and metrics a resumed run starts from: a last.pt's, or its run's best.pt's if higher. An
    epoch's validation lands during the next epoch, after that epoch's last.pt, so a crash can leave a best.pt
    better than the last.pt recorded, which a worse epoch must not overwrite after resuming. A best.pt that cannot be
    read does not stop the resume (load_resumable's note names it): the last.pt's values stand."""
    if best_path.is_file():
        try:
            best = load_checkpoint(best_path)
        except CheckpointError:
            return fitness, metrics
        if best.get("best_fitness") is not None and (fitness is None or best["best_fitness"] > fitness):
            return best["best_fitness"], dict(best.get("metrics") or {})
    return fitness, metrics


def load_resumable(path: str | os.PathLike[str]) -> dict[str, Any]:
    """load_checkpoint for resume=: where the last.pt cannot be read and the one it replaced (last.prev.pt, kept by
    save_atomic) can, that one, an epoch or so earlier. What a user should know (that fallback; a best.pt beside it
    that cannot be read, which does not stop the resume) is in the record's "notes"; each names what to do next."""
    path = Path(path)
    notes: list[str] = []
    try:
        ckpt = load_checkpoint(path)
    except CheckpointError as e:
        previous = previous_of(path)
        if not previous.is_file() or path.name != "last.pt":
            raise CheckpointError(f"{e}. {_no_resume_hint(path)}") from None
        try:
            ckpt = load_checkpoint(previous)
        except CheckpointError as e2:
            raise CheckpointError(f"{e}; the earlier {e2}. {_no_resume_hint(path)}") from None
        notes.append(
            f"{e}; resuming from the checkpoint it replaced, {previous} (epoch {ckpt.get('epoch')}, step "
            f"{ckpt.get('step')}): the steps after it are trained again. Delete or move the unreadable file if you "
            "want to keep it; the next save replaces it"
        )
    best = path.with_name("best.pt")
    if best.is_file():
        try:
            load_checkpoint(best)
        except CheckpointError as e:
            notes.append(
                f"{e}; resuming without it: the first epoch that improves on the last.pt's best fitness "
                f"({ckpt.get('best_fitness')}) writes a new best.pt (move the unreadable one away to keep it)"
            )
    ckpt["notes"] = notes
    return ckpt


def low_space_note(folder: Path, checkpoint_bytes: int) -> str | None:
    """A note when folder's file system has less free space than three checkpoints of this size (last.pt, the
    previous last.pt kept beside it, best.pt): a run would stop at a checkpoint it cannot write."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    if free >= 3 * checkpoint_bytes:
        return None
    each = checkpoint_bytes / 2**20
    return (
        f"{folder} has {free / 2**20:.0f} MB free, less than three checkpoints of this run (~{each:.0f} MB each: "
        "last.pt, the previous last.pt, best.pt); the run stops with an error at the first one that does not fit. "
        "Free space there, or train into another project=..."
    )


def checkpoint_bytes(net: torch.nn.Module, ckpt_path: Path | None) -> int:
    """A last.pt's size: the resumed one's, or for a new run five times the network's parameters and buffers (the
    EMA weights, the training weights, up to two optimizer moments, and the rest: a LibreYOLO9t last.pt was 4.8
    times its best.pt, 36.5 MB)."""
    if ckpt_path is not None and ckpt_path.is_file():
        return ckpt_path.stat().st_size
    return 5 * sum(t.numel() * t.element_size() for t in [*net.parameters(), *net.buffers()])


def open_run_dir(
    run_dir: Path, args: dict[str, Any], net: torch.nn.Module, resumed_from: str | None, notes: list[str]
) -> None:
    """Rank 0, before anything is written into the run folder: this process becomes its one writer (runs.py's lock,
    released by unlock_run_dir or the process's end), weights/ made, a killed run's unfinished checkpoint files
    removed, a note if the disk is short of three checkpoints, args.yaml written."""
    lock_run_dir(run_dir)
    (run_dir / "weights").mkdir(parents=True, exist_ok=True)
    if stale := remove_stale_temporaries(run_dir / "weights"):
        notes.append(f"removed {len(stale)} unfinished checkpoint file(s) of a killed run: {', '.join(stale)}")
    if low := low_space_note(run_dir, checkpoint_bytes(net, Path(resumed_from) if resumed_from else None)):
        notes.append(low)
    write_args(run_dir, args)


def _no_resume_hint(path: Path) -> str:
    best = path.with_name("best.pt")
    if path.name == "last.pt" and best.is_file():
        return (
            f"This run cannot be resumed; its best weights can start a new run: libreyolo train model={best} "
            "data=... epochs=..."
        )
    return "This run cannot be resumed; start a new run (libreyolo train model=... data=...)"


def resolve_resume_path(cfg: TrainConfig) -> Path:
    if isinstance(cfg.resume, str):
        return Path(cfg.resume)
    if cfg.model.endswith(".pt") and Path(cfg.model).name == "last.pt":
        return Path(cfg.model)
    runs = sorted(glob.glob(str(Path(cfg.project) / "*" / "weights" / "last.pt")), key=os.path.getmtime)
    if not runs:
        raise CheckpointError(f"resume=true but no {cfg.project}/*/weights/last.pt exists; pass resume=path/to/last.pt")
    return Path(runs[-1])
