"""Errors a user can act on: each message names the file, key or value and says what to do."""


class LibreYOLOError(Exception):
    """Base class; the CLI prints these without a traceback."""


class ConfigError(LibreYOLOError, ValueError):
    """A bad key or value in the training configuration."""


class DataError(LibreYOLOError, ValueError):
    """A dataset yaml, folder, image or label that cannot be used."""


class CheckpointError(LibreYOLOError, ValueError):
    """A checkpoint that is missing, corrupt or not in libreyolo's safe format."""


class DeviceMemoryError(LibreYOLOError, RuntimeError):
    """The device ran out of memory; the message names the run's batch and image size, what the allocation needed,
    what was free, who holds the rest and what to change (libreyolo/oom.py). torch's error is its __cause__."""


class DiskFullError(LibreYOLOError, OSError):
    """No space left on the device a run's file was being written to: `no space left on device writing PATH (N MB
    free)`. The file being written was left as it was before (checkpoints are replaced atomically, events.jsonl is cut
    back to its last whole line). `at(path)` makes one; `disk_full_in(exc)` finds ENOSPC in an exception's chain."""

    @classmethod
    def at(cls, path: object) -> "DiskFullError":
        import os
        import shutil

        folder = os.path.dirname(os.path.abspath(str(path)))
        while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
            folder = os.path.dirname(folder)
        try:
            free = f"{shutil.disk_usage(folder).free / 2**20:.0f} MB free"
        except OSError:
            free = "free space unknown"
        return cls(f"no space left on device writing {path} ({free})")


def disk_full_in(exc: BaseException | None) -> bool:
    """Whether exc, or an exception it was raised from or during, is ENOSPC (or EDQUOT: a full quota). torch.save
    reports a failed write as a RuntimeError ('unexpected pos ...') with the OSError only in its chain."""
    import errno

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class InstallError(LibreYOLOError, RuntimeError):
    """The installed packages do not work together (a torchvision built for another torch); says what to install."""
