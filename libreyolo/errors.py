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
