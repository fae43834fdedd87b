"""Advisory file locks (flock) that coordinate the processes of one host: DDP ranks, concurrent runs.

The kernel drops a process's locks when it dies, so a crashed run never leaves a lock held. Lock files are
empty and are never deleted: deleting one while another process is about to lock it would let two
processes believe they hold the same lock."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; each process then builds and owns its own cache
    fcntl = None  # type: ignore[assignment]


def shared_dir() -> Path:
    """$LIBREYOLO_SHM_DIR, else /dev/shm (memory-backed, host-wide), else the temp folder (where the page
    cache keeps what is used)."""
    env = os.environ.get("LIBREYOLO_SHM_DIR")
    if env:
        return Path(env).expanduser()
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm
    return Path(tempfile.gettempdir())


class HostLock:
    """One lock file; `acquire(shared=..., wait=...)` -> bool, `release()`. Not re-entrant."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def acquire(self, shared: bool = False, wait: bool = True) -> bool:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_CREAT | os.O_RDONLY, 0o666)  # flock needs no write access
        if fcntl is None:
            return True
        flags = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB)
        try:
            fcntl.flock(self.fd, flags)
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        if self.fd is None:
            return
        if fcntl is not None:
            # unlock the open file description itself: forked DataLoader workers share it through their
            # inherited descriptor, and merely closing ours would leave the lock held by them
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None

    def __getstate__(self) -> dict:
        # a spawned worker gets the path only; it never holds (or releases) its parent's lock
        return {"path": self.path, "fd": None}
