"""actors/schedule.Stepper, the coroutine wrapper of a tracked task, looks like the coroutine it wraps to asyncio and
debuggers: its attributes are the coroutine's, and an awaitable that is not a native coroutine answers None / False
for the cr_* attributes instead of raising (asyncio's task repr reads them)."""

from __future__ import annotations

import asyncio
import collections.abc

import pytest

from slime_actors.actors.schedule import Schedule, Stepper


class Awaitable(collections.abc.Coroutine):
    """A coroutine object that is not a native one: no cr_code, cr_frame, cr_await, cr_running."""

    def send(self, value):
        raise StopIteration(7)

    def throw(self, typ, val=None, tb=None):
        raise typ if val is None else val

    def __await__(self):
        return iter(())


async def native():
    await asyncio.sleep(0)
    return 5


def _stepper(coro) -> Stepper:
    return Stepper(Schedule(lambda *a: None, None), "t", coro)


def test_a_native_coroutines_attributes_come_through():
    coro = native()
    st = _stepper(coro)
    try:
        assert st.cr_code is coro.cr_code and st.cr_frame is coro.cr_frame and st.cr_await is None
        assert st.cr_running is False and st.__qualname__ == "native" and st.__name__ == "native"
    finally:
        coro.close()


def test_an_awaitable_without_cr_attributes_answers_none_and_false_and_nothing_else_is_made_up():
    st = _stepper(Awaitable())
    assert (st.cr_code, st.cr_frame, st.cr_await, st.cr_running) == (None, None, None, False)
    with pytest.raises(AttributeError, match="gi_frame"):
        st.gi_frame
    with pytest.raises(AttributeError):
        Stepper.__new__(Stepper).gi_frame   # no coroutine set: an AttributeError, not a recursion


def test_a_task_over_either_runs_and_has_a_repr():
    async def main():
        loop = asyncio.get_running_loop()
        sched = Schedule(lambda *a: None, loop)
        tasks = [sched.task(native(), "a"), sched.task(Awaitable(), "b")]
        assert all(repr(t) for t in tasks)
        return await asyncio.gather(*tasks)
    assert asyncio.run(main()) == [5, 7]
