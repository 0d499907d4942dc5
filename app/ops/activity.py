"""When each caller last wrote, shared by the API processes of one `serve --workers N`.

Write admission rests a caller's writes while *other* callers are active (app.ops.backpressure's duty cycle). A
process alone cannot tell: a client's keep-alive connections stay with the worker that accepted them, so the single
writers beside a flood may all be in one process while the other runs the flood at full speed, on the same two cores.
So the supervisor creates a small file (`ACTIVITY_FILE_ENV` names it to the children), each process maps it and
writes each caller's latest grant or release into the slot its name hashes to, and reads every slot to learn whether
someone else wrote lately. Slots are a (name hash, monotonic time) pair, written without a lock: a torn or colliding
entry at worst hides another caller for one window, or shows one that has gone, for one write's rest.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import zlib
from pathlib import Path

ACTIVITY_FILE_ENV = "METALEDGER_WRITE_ACTIVITY_FILE"  # set by app.supervisor for its children
SLOTS = 64
_SIZE = SLOTS * 16  # SLOTS hashes (int64), then SLOTS times (float64)


def create_activity_file() -> Path:
    """A zeroed file for the children to map (the supervisor removes it when it stops)."""
    fd, name = tempfile.mkstemp(prefix="metaledger-write-activity-")
    with os.fdopen(fd, "wb") as file:
        file.write(bytes(_SIZE))
    return Path(name)


def _name_hash(caller: str) -> int:
    return zlib.crc32(caller.encode()) + 1  # never 0: a slot never written


class SharedActivity:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        with open(path, "r+b") as file:
            self._map = mmap.mmap(file.fileno(), _SIZE)
        view = memoryview(self._map)
        self._hashes = view[: SLOTS * 8].cast("q")
        self._times = view[SLOTS * 8 :].cast("d")

    @classmethod
    def from_environment(cls) -> SharedActivity | None:
        path = os.environ.get(ACTIVITY_FILE_ENV)
        return cls(path) if path else None

    def mark(self, caller: str, now: float) -> None:
        """`caller` wrote at `now` (time.monotonic(), which every process of the machine shares)."""
        key = _name_hash(caller)
        slot = key % SLOTS
        self._hashes[slot] = key
        self._times[slot] = now

    def others_since(self, caller: str, since: float) -> bool:
        """Whether a caller other than `caller` wrote at `since` or later, in any process."""
        key = _name_hash(caller)
        times, hashes = self._times, self._hashes
        for slot in range(SLOTS):
            if times[slot] >= since and hashes[slot] != key:
                return True
        return False
