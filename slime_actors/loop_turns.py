"""One piece of heavy work per turn of the event loop (`LoopTurns`), so that what waits for the loop between them --
replies to read, tasks they wake -- is not held behind all of them.

An asyncio loop runs, in one turn, every callback that was ready when the turn began, in order. When a rollout's last
groups come back from the engine within a few milliseconds of each other, their answers are ready together, and the
rollout worker parsed, recorded, decoded and sent to scoring one group after another in a single turn -- ~0.5-1 ms a
group on one H100's host --, so the reward worker's replies to the first groups, read meanwhile, waited for all of
them, and those groups' submits went out together at the end and queued at the buffer (docs/performance.md, *A step's
orchestration, seventh pass*). Work that takes a turn with `await turns.take()` first runs alone in its turn; other
takers wait, in the order they came, each for a turn after the tasks the one before it woke (a reply read while it
worked runs first). Taking a free turn does not suspend: a lone answer is handled as soon as it comes.
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["LoopTurns"]


class LoopTurns:
    """At most one `take()` returns per turn of the running event loop, with two turns between one taker's and the
    next one's; the others wait, first come first served (a future each: no timers, nothing to close). Heavy work
    done right after `take()` -- before the task next suspends -- is then one piece at a time, with the loop's other
    work between."""

    __slots__ = ("_taken", "_waiting", "_loop", "taken", "waited")

    def __init__(self) -> None:
        self._taken = False
        self._waiting: deque[asyncio.Future] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None   # the loop of the last turn taken
        self.taken = 0    # turns taken
        self.waited = 0   # of which after waiting for a later turn

    async def take(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # another loop's turns (one that stopped before freeing its last turn can leave it taken): not this one's
            self._taken, self._waiting, self._loop = False, deque(), loop
        if self._taken:
            self.waited += 1
            fut = loop.create_future()
            self._waiting.append(fut)
            try:
                await fut    # (handed a turn by `_hand`)
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():   # handed over, then cancelled before it ran: pass it on
                    self._free()
                elif fut in self._waiting:   # (else `_hand` dropped it already)
                    self._waiting.remove(fut)
                raise
        self._taken = True
        self.taken += 1
        loop.call_soon(self._free)

    def _free(self) -> None:
        """The taker's turn is over (this runs at the start of the next one). With others waiting, the first of
        them is handed a turn one turn later still (`_hand`): what the taker's work woke meanwhile -- a reply read
        in this turn, whose task runs in the next -- goes before it. Until then the turns stay taken, so none comes in
        before the waiters."""
        if self._waiting:
            asyncio.get_running_loop().call_soon(self._hand)
        else:
            self._taken = False

    def _hand(self) -> None:
        while self._waiting:
            fut = self._waiting.popleft()
            if not fut.done():   # (one cancelled while it waited is skipped)
                fut.set_result(None)
                return
        self._taken = False
