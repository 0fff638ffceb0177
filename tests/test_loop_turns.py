"""One piece of heavy work per turn of the event loop (slime_actors/loop_turns.py), and the engine client parsing its
/generate answers one per turn: a rollout's last groups come back together, and a reply read between two of them is
taken between them instead of after all of them.

Turns are counted by a callback that schedules itself again each time it runs: the loop runs it once a turn. Each
test runs on asyncio's own loop and on uvloop (the actors' loop)."""

from __future__ import annotations

import asyncio
import json

import pytest
import uvloop
from aiohttp import web

from slime_actors.backends import engine_client as ec
from slime_actors.loop_turns import LoopTurns


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request):
    return asyncio.run if request.param == "asyncio" else uvloop.run


class TurnCounter:
    def __init__(self) -> None:
        self.n = 0
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.n += 1
        self._handle = self._loop.call_soon(self._tick)

    def stop(self) -> None:
        self._handle.cancel()


def test_a_free_turn_is_taken_without_suspending(run):
    async def main():
        turns, counter = LoopTurns(), TurnCounter()
        before = counter.n
        await turns.take()
        assert counter.n == before          # no turn passed: a lone answer is handled at once
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        await turns.take()                   # the turn after next: free again
        counter.stop()
        assert (turns.taken, turns.waited) == (2, 0)
    run(main())


def test_takers_of_one_turn_get_one_turn_each_in_the_order_they_came(run):
    async def main():
        turns, counter = LoopTurns(), TurnCounter()
        got: list[tuple[str, int]] = []

        async def taker(name: str) -> None:
            await turns.take()
            got.append((name, counter.n))
        await asyncio.gather(*(taker(n) for n in "abcde"))
        counter.stop()
        assert [n for n, _ in got] == list("abcde")
        at = [t for _, t in got]
        assert all(b > a for a, b in zip(at, at[1:])), got    # each in a later turn than the one before
        assert (turns.taken, turns.waited) == (5, 4)
        assert not turns._taken and not turns._waiting          # free again afterwards
    run(main())


def test_what_the_first_takers_work_wakes_runs_before_the_second_takers_work(run):
    """The case of a reply: the first group's work sends a score ask, whose reply is read (here: a future set by a
    callback) while the second group's answer waits for its turn. The reply's task runs before the second's work."""
    async def main(turns: LoopTurns | None) -> list[str]:
        loop = asyncio.get_running_loop()
        order: list[str] = []
        reply = loop.create_future()

        async def on_reply() -> None:
            await reply
            order.append("reply to a")

        async def group(name: str) -> None:
            if turns is not None:
                await turns.take()
            order.append(name)
            if name == "a":
                loop.call_soon(reply.set_result, None)
        waiter = asyncio.ensure_future(on_reply())
        await asyncio.sleep(0)
        await asyncio.gather(group("a"), group("b"), group("c"))
        await waiter
        return order
    assert run(main(LoopTurns())) == ["a", "reply to a", "b", "c"]
    assert run(main(None)) == ["a", "b", "c", "reply to a"]   # (without turns: after all of them)


def test_a_taker_cancelled_while_it_waits_or_once_handed_the_turn_does_not_stop_the_others(run):
    async def main():
        turns = LoopTurns()
        loop = asyncio.get_running_loop()
        order: list[str] = []
        tasks: dict[str, asyncio.Task] = {}

        async def taker(name: str, then=None) -> None:
            await turns.take()
            order.append(name)
            if then is not None:
                then()
        # b cancels c in its own turn, after which `_free` hands c the next turn: c is cancelled holding it
        tasks["b"] = asyncio.ensure_future(taker("b", lambda: loop.call_soon(tasks["c"].cancel)))
        tasks["c"] = asyncio.ensure_future(taker("c"))
        tasks["d"] = asyncio.ensure_future(taker("d"))
        tasks["e"] = asyncio.ensure_future(taker("e"))
        await asyncio.sleep(0)        # all four started: b took the turn, c, d and e wait
        tasks["d"].cancel()           # cancelled while it waits
        done = await asyncio.wait_for(asyncio.gather(*tasks.values(), return_exceptions=True), 5)
        assert order == ["b", "e"]
        assert isinstance(done[1], asyncio.CancelledError) and isinstance(done[2], asyncio.CancelledError)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not turns._taken and not turns._waiting
        await asyncio.wait_for(turns.take(), 1)   # and it is still usable
    run(main())


def test_a_loop_that_stopped_holding_a_turn_does_not_hold_the_next_loops():
    """A loop stopped in the turn a turn was taken ends before the callback that frees it runs: the turns, used again
    on another loop, start free there."""
    turns = LoopTurns()
    first = asyncio.new_event_loop()

    async def take_and_stop() -> None:
        await turns.take()
        first.stop()
    try:
        first.create_task(take_and_stop())
        first.run_forever()
    finally:
        first.close()
    assert turns._taken                      # (the first loop's turn was never freed)

    async def again() -> None:
        await asyncio.wait_for(turns.take(), 2)
    asyncio.run(again())
    assert turns.taken == 2 and turns.waited == 0


class HeldAnswers:
    """An engine whose /generate answers wait until `n` requests have come, then all go out at once (as a rollout's
    last groups come back from SGLang within a few ms)."""

    def __init__(self, n: int):
        self.n, self.come = n, 0
        self.all_here = asyncio.Event()
        self.runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/generate", self._generate)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.come += 1
        if self.come >= self.n:
            self.all_here.set()
        await self.all_here.wait()
        answers = [{"output_ids": [5, 6], "meta_info": {"id": str(k), "finish_reason": {"type": "length"},
                                                        "output_token_logprobs": [[-0.5, 5, None], [-0.25, 6, None]]}}
                   for k in range(len(body["input_ids"]))]
        return web.Response(body=json.dumps(answers).encode(), content_type="application/json")

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def test_the_engine_client_parses_its_generate_answers_one_per_turn(monkeypatch, run):
    n = 6

    async def main():
        server = HeldAnswers(n)
        url = await server.start()
        counter = TurnCounter()
        parsed_at: list[int] = []
        loads = ec._loads

        def counted(raw: bytes):
            parsed_at.append(counter.n)
            return loads(raw)
        monkeypatch.setattr(ec, "_loads", counted)
        try:
            async with ec.EngineClient(url, timeout=30) as client:
                outs = await asyncio.gather(*(client.generate([[1, 2], [3, 4]], {"max_new_tokens": 2})
                                              for _ in range(n)))
                assert [len(o) for o in outs] == [2] * n
                assert ec.parse_generate_output(outs[0][0]).logprobs == [-0.5, -0.25]
                assert client.answer_turns.taken == n
        finally:
            counter.stop()
            await server.stop()
        assert len(parsed_at) == n and len(set(parsed_at)) == n, parsed_at   # each answer in a turn of its own
    run(main())


def test_control_answers_take_no_turn(run):
    """Only /generate answers take turns: a health probe or an abort is answered at once, never queued behind
    generation's answers."""
    async def main():
        app = web.Application()
        async def flushed(request: web.Request) -> web.Response:
            return web.Response(text="ok")
        app.router.add_post("/flush_cache", flushed)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        try:
            async with ec.EngineClient(url, timeout=30) as client:
                assert await client.flush_cache()
                assert client.answer_turns.taken == 0
        finally:
            await runner.cleanup()
    run(main())
