"""For tests of tasks whose errors nobody awaits: asyncio logs "Task exception was never retrieved" when such a task
is garbage-collected. `watch()` records those messages on the running loop; `settled()` lets pending callbacks run
and collects the garbage, so what would be logged has been by the time it returns."""

from __future__ import annotations

import asyncio
import gc


def watch() -> list[str]:
    """The running loop's error messages from now on (its exception handler appends them to the list returned)."""
    seen: list[str] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: seen.append(context.get("message")))
    return seen


async def settled() -> None:
    for _ in range(3):
        await asyncio.sleep(0)
    gc.collect()
    await asyncio.sleep(0)
