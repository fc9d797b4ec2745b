"""A cursor kept in a file, so that a reader resumes where it stopped after a restart.

``CursorFile.save`` writes the cursor to a temporary file beside the target, flushes it to
disk, renames it over the target (atomic on POSIX and on Windows) and flushes the directory:
after a crash the file holds either the old cursor or the new one, never a mix.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional, Union

__all__ = ["CursorFile", "CursorStore"]


class CursorStore:
    """Where a follower keeps its cursor: ``load()`` at start, ``save()`` after each batch.

    Subclass it to keep the cursor elsewhere (a database row committed with the records).
    """

    def load(self) -> Optional[str]:
        raise NotImplementedError

    def save(self, cursor: str) -> None:
        raise NotImplementedError


def _valid(text: str) -> bool:
    return len(text) % 2 == 0 and all(c in "0123456789abcdef" for c in text)


class CursorFile(CursorStore):
    """The cursor as one line of lowercase hex in ``path`` (created on the first save)."""

    def __init__(self, path: Union[str, "os.PathLike[str]"]) -> None:
        self.path = Path(path)

    def load(self) -> Optional[str]:
        """The saved cursor, or ``None`` when there is no file (or it is empty)."""
        try:
            text = self.path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return None
        if not text:
            return None
        if not _valid(text):
            raise ValueError(f"{self.path}: not a delivery cursor (lowercase hex): {text[:40]!r}")
        return text

    def save(self, cursor: str) -> None:
        if not _valid(cursor):
            raise ValueError(f"not a delivery cursor (lowercase hex): {cursor[:40]!r}")
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(cursor + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        _fsync_dir(directory)

    def clear(self) -> None:
        """Forgets the cursor (the next start reads a snapshot)."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        _fsync_dir(self.path.parent)


def _fsync_dir(directory: Path) -> None:
    if os.name != "posix":
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
