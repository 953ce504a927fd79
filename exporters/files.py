"""Crash-safe file writes shared by the builders, the rule engine's state and the log index."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _file_mode() -> int:
    """The mode ``open()`` would give a new file: 0o666 less the process's umask."""
    umask = os.umask(0o022)  # read it by setting it (once, at import) and putting it back
    os.umask(umask)
    return 0o666 & ~umask


FILE_MODE = _file_mode()


def write_atomic(path: str | os.PathLike[str], data: str | bytes, *, fsync: bool = False) -> int:
    """Write ``data`` to a temporary file beside ``path`` and rename it over ``path``.

    A reader sees the old file or the new one, never a half-written one; a failure removes the
    temporary file. With ``fsync`` the data is on disk before the rename. The file gets the mode a
    plain ``open()`` would give it (``mkstemp`` makes 0600: the built rules and dashboards must be
    readable by the Prometheus, Alertmanager and Grafana users that mount them). Returns the bytes
    written.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(payload)
