"""CPU work on the event loop in short slices.

A process's requests share one event loop: a batch's parsing, validation or decision done in one stretch holds up
every other request of the process for as long (a 1,000-proposal batch is a few hundred ms of CPU, more when the
machine is busy). Long loops check a `TimeSlice` between items and give the loop a turn once it is over, so a
single write waits at most about `SLICE_S` behind a batch at each of its own steps. Time, not an item count: items
cost from microseconds to milliseconds, and a busy machine stretches them all.
"""

from __future__ import annotations

import asyncio
import time

SLICE_S = 0.005  # the longest stretch of one request's CPU work between two turns of the event loop


class TimeSlice:
    __slots__ = ("_ends",)

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        """A new slice from now (after a turn: the turn itself is not this request's CPU time)."""
        self._ends = time.perf_counter() + SLICE_S

    def over(self) -> bool:
        return time.perf_counter() >= self._ends

    async def pause_if_over(self) -> None:
        """A turn of the event loop when the slice is over, then a new slice."""
        if self.over():
            await asyncio.sleep(0)
            self.restart()
