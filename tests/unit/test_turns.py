"""Time slices of CPU work on the event loop (app.turns): a turn once a slice is over, as long as the slice while
other callers' writes are in flight, at once otherwise."""

from __future__ import annotations

import asyncio
import time

from app import turns
from app.turns import TimeSlice, turn


def test_a_slice_is_over_after_its_time_and_restarts(monkeypatch):
    monkeypatch.setattr(turns, "SLICE_S", 0.02)
    cpu = TimeSlice()
    assert not cpu.over()
    time.sleep(0.025)  # the slice's time passes: being over after it is the behaviour
    assert cpu.over()
    cpu.restart()
    assert not cpu.over()


async def test_a_turn_lets_the_other_tasks_run():
    ran = []
    asyncio.get_running_loop().call_soon(ran.append, "other")
    await turn()
    assert ran == ["other"]


async def test_a_turn_is_at_once_uncontended_and_a_slice_long_contended(monkeypatch):
    monkeypatch.setattr(turns, "SLICE_S", 0.05)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await turn(lambda: False)
    assert loop.time() - started < 0.04
    started = loop.time()
    await turn(lambda: True)
    assert loop.time() - started >= 0.045


async def test_pause_if_over_turns_only_once_the_slice_is_over(monkeypatch):
    monkeypatch.setattr(turns, "SLICE_S", 3600.0)
    asked = []
    cpu = TimeSlice()
    await cpu.pause_if_over(lambda: asked.append(1) or True)
    assert asked == []  # not over: no turn, contention not even asked
    monkeypatch.setattr(turns, "SLICE_S", 0.0)
    cpu.restart()
    await cpu.pause_if_over(lambda: asked.append(1) or False)
    assert asked == [1]
