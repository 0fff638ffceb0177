"""One process bootstrap for every actor process (slime_actors/launch/actor.py: `set_up_process`, `serve`) -- the
actor entry's, torchrun's ranks' and the tests' spawned children -- and one model cache (models.resolve.model_cache)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from helpers import Echo, spawn_actor, wait_for

from slime_actors import env as E
from slime_actors.launch.actor import serve
from slime_actors.mailbox.errors import PeerDown
from slime_actors.models.resolve import model_cache
from slime_actors.retry import RetryPolicy
from slime_actors.runtime import RuntimeConfig


class FakeActor:
    """What `serve` uses of an actor: start, stop, spawn, wait_stopped."""

    def __init__(self, fail: BaseException | None = None, on_start=None):
        self.fail, self.on_start = fail, on_start
        self.stopped_because: str | None = None
        self._stopped = asyncio.Event()

    async def start(self, runtime):
        if self.on_start is not None:
            self.on_start()
            await asyncio.sleep(0.05)  # a signal's handler runs on the loop's next turn
        if self.fail is not None:
            raise self.fail

    async def stop(self, reason):
        self.stopped_because = self.stopped_because or reason
        self._stopped.set()

    def spawn(self, coro):
        return asyncio.get_running_loop().create_task(coro)

    async def wait_stopped(self):
        await self._stopped.wait()


def _maker(actors: list[FakeActor]):
    made = []

    async def make():
        made.append(actors[len(made)])
        return made[-1], None
    return make, made


JOIN = RetryPolicy(attempts=None, deadline=60, base=0.0, factor=1.0, max_delay=0.0, retry_on=(PeerDown,))


def test_a_join_starts_fresh_actors_until_one_starts():
    actors = [FakeActor(PeerDown("directory/0")), FakeActor(PeerDown("directory/0")), FakeActor()]
    make, made = _maker(actors)
    seen = []

    async def main():
        def ready(actor):
            seen.append(actor)
            actor.spawn(actor.stop("the job ended"))   # it stops by itself: no signal
        return await serve(make, join=JOIN, ready=ready)
    assert asyncio.run(main()) is None
    assert made == actors and seen == [actors[2]]
    assert [a.stopped_because for a in actors] == ["failed to start", "failed to start", "the job ended"]


def test_without_a_join_a_failed_start_is_raised_after_the_actor_stopped():
    make, made = _maker([FakeActor(PeerDown("directory/0")), FakeActor()])
    with pytest.raises(PeerDown):
        asyncio.run(serve(make))
    assert len(made) == 1 and made[0].stopped_because == "failed to start"


def test_errors_the_join_does_not_retry_are_raised_at_once():
    make, made = _maker([FakeActor(ValueError("bad config")), FakeActor()])
    with pytest.raises(ValueError, match="bad config"):
        asyncio.run(serve(make, join=JOIN))
    assert len(made) == 1


def test_a_signal_ends_the_join_and_stops_a_started_actor():
    def kill():
        os.kill(os.getpid(), signal.SIGTERM)                # the loop's handler catches it
    make, made = _maker([FakeActor(PeerDown("directory/0"), on_start=kill), FakeActor()])
    with pytest.raises(PeerDown):                           # no second try after the signal
        asyncio.run(serve(make, join=JOIN))
    assert len(made) == 1
    started = FakeActor(on_start=kill)                     # the signal came while it started: stopped once up
    make, made = _maker([started])
    assert asyncio.run(serve(make)) == "SIGTERM" and started.stopped_because == "signal SIGTERM"


def test_a_spawned_actor_process_stops_cleanly_on_sigterm(tmp_path):
    rt = RuntimeConfig(run_dir=str(tmp_path), curve=False)
    p = spawn_actor(Echo, 1, rt)
    p.terminate()
    assert wait_for(lambda: not p.is_alive(), 30)
    assert p.exitcode == 0                                  # stopped by its handler, not killed by the signal
    log = (tmp_path / "logs" / "echo-1.jsonl").read_text()
    assert "actor stopped" in log and "signal SIGTERM" in log


def test_one_model_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(E.MODEL_CACHE.name, raising=False)
    assert model_cache(tmp_path / "runs" / "digits") == tmp_path / "runs" / ".models"
    assert model_cache() == Path.home() / ".cache" / "slime-actors" / "models"
    monkeypatch.setenv(E.MODEL_CACHE.name, str(tmp_path / "cache"))
    assert model_cache(tmp_path / "runs" / "digits") == model_cache() == tmp_path / "cache"


def test_the_head_and_a_backend_make_a_tiny_model_in_the_same_place(tmp_path, monkeypatch):
    from helpers import job_config

    from slime_actors.data import load_tokenizer
    from slime_actors.launch.prepare import prepare_head
    monkeypatch.delenv(E.MODEL_CACHE.name, raising=False)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "1 2 first =", "label": "1"}\n')
    run = tmp_path / "runs" / "digits"
    cfg = job_config(run_dir=str(run), prompt_data=str(prompts), hf_checkpoint="tiny:cache")
    assert load_tokenizer(cfg) is not None                 # a tokenizer from the spec: the model made in the cache
    made = tmp_path / "runs" / ".models" / "tiny-cache"
    assert (made / "config.json").exists() and not (run / "models").exists()
    prepare_head(cfg)
    assert cfg.model.hf_checkpoint == str(made)
