"""CPU work on the event loop in short slices.

A process's requests share one event loop: a batch's parsing, validation or decision done in one stretch holds up
every other request of the process for as long (a 1,000-proposal batch is a few hundred ms of CPU, more when the
machine is busy). Long loops check a `TimeSlice` between items and give the loop a turn once it is over, so a
single write waits at most about `SLICE_S` behind a batch at each of its own steps. Time, not an item count: items
cost from microseconds to milliseconds, and a busy machine stretches them all.

A turn alone is not enough when the batch never runs out of work: the loop is then always busy, and a single write
waits a slice at each of its steps (ten or so: admission, parsing, each statement, the response). So while other
callers' writes are in flight (`contended`, from app.ops.backpressure) a turn lasts as long as the slice before it:
the batch gets half of the loop, and the loop has time to spare for the others. Alone, a batch runs at full speed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

SLICE_S = 0.002  # the longest stretch of one request's CPU work between two turns of the event loop


class TimeSlice:
    __slots__ = ("_ends",)

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        """A new slice from now (after a turn: the turn itself is not this request's CPU time)."""
        self._ends = time.perf_counter() + SLICE_S

    def over(self) -> bool:
        return time.perf_counter() >= self._ends

    async def pause_if_over(self, contended: Callable[[], bool] | None = None) -> None:
        """A `turn` of the event loop when the slice is over, then a new slice."""
        if self.over():
            await turn(contended)
            self.restart()


async def turn(contended: Callable[[], bool] | None = None) -> None:
    """The event loop's turn after a slice of CPU work: at once, or while `contended()` a slice long."""
    await asyncio.sleep(SLICE_S if contended is not None and contended() else 0)
