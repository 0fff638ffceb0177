"""A rollout worker hands a scored group to the buffer (`submit`): asked again while the buffer does not answer
(restarting: the same idempotency key, applied at most once); given back at once when the buffer's handler refuses
its samples -- asking again would get the same answer, and a group left leased to the worker would hold the rollout
up (leases do not run out). No engine, no buffer process: the worker's buffer is a stub."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from slime_actors.actors import rollout as rollout_module
from slime_actors.actors.rollout import RolloutWorker, submit_key
from slime_actors.backends.engine_client import EngineError, EngineTimeout, EngineUnavailable
from slime_actors.config import parse_config
from slime_actors.mailbox.errors import AskTimeout, RemoteError
from slime_actors.messages import Returned, Submitted
from slime_actors.retry import RetryPolicy
from slime_actors.types import Sample

DIGITS = str(Path(__file__).resolve().parents[1] / "examples" / "digits" / "config.toml")


def samples() -> list[Sample]:
    return [Sample(index=j, group_index=0, prompt="1 2 first =", response="1", response_tokens=[5], loss_mask=[1],
                   rollout_log_probs=[-0.5], reward=1.0) for j in range(2)]


class Buffer:
    """submit answers with the errors in `fail` first, one per ask, then accepts; asks are recorded."""

    def __init__(self, *fail: Exception):
        self.fail = list(fail)
        self.asks: list[tuple] = []

    async def submit(self, worker, work_id, samples, ask_timeout=None, idem=None):
        self.asks.append(("submit", work_id, idem))
        if self.fail:
            raise self.fail.pop(0)
        return Submitted(True, None, "done")

    async def return_work(self, worker, work_id, reason=None, samples=None, failed=None, ask_timeout=None):
        self.asks.append(("return_work", work_id, reason) + (("failed",) if failed else ()))
        return Returned(True)


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    """The retries' waits shortened (what is tested is whether and how often the worker asks)."""
    monkeypatch.setattr(rollout_module, "SUBMIT_RETRY", RetryPolicy(
        attempts=3, base=0.0, retry_on=rollout_module.SUBMIT_RETRY.retry_on,
        retry_if=rollout_module.SUBMIT_RETRY.retry_if))


def hand_in(buffer: Buffer) -> Buffer:
    w = RolloutWorker(0, args=parse_config(["--config", DIGITS]).to_dict())
    w.buffer = buffer
    asyncio.run(w._submit("train-3", samples(), 2))
    return buffer


def test_a_submit_the_buffer_did_not_answer_is_asked_again_with_the_same_key():
    buf = hand_in(Buffer(AskTimeout("buffer/0", "submit", 60), RemoteError("buffer/0", "submit", "MailboxError",
                                                                            "buffer/0 stopped while handling")))
    key = submit_key("train-3", 2, samples()[0])
    assert buf.asks == [("submit", "train-3", key)] * 3


def test_a_group_whose_samples_the_buffer_refuses_is_given_back_at_once():
    refused = RemoteError("buffer/0", "submit", "ValueError", "train-3: expected 2 samples, got 1")
    buf = hand_in(Buffer(refused))
    assert [a[0] for a in buf.asks] == ["submit", "return_work"]      # (not asked again: the same answer would come)
    assert buf.asks[1][2].startswith("submit refused:") and "expected 2 samples" in buf.asks[1][2]
    assert buf.asks[1][3] == "failed"   # (counted toward the group's errors: the third time it is failed)


def test_a_buffer_gone_for_good_leaves_the_group_to_its_restart():
    buf = hand_in(Buffer(*[AskTimeout("buffer/0", "submit", 60)] * 3))
    assert [a[0] for a in buf.asks] == ["submit"] * 3    # (no return_work: it would not be answered either)


class Generation:
    """A worker's generation whose `group` raises `error` (a user's generate function, an engine call), or marks the
    samples aborted (an engine paused for a weight update)."""

    env = agent_fn = None   # (no environment, no agent: an aborted group goes back with its partial samples)

    def __init__(self, error: Exception | None):
        self.error = error

    async def group(self, samples, sp, attempt, kind, work_id):
        if self.error is not None:
            raise self.error
        for s in samples:
            s.status = "aborted"
        return samples


ENGINE_DOWN = EngineUnavailable("/generate", None, "cannot reach http://127.0.0.1:1: connection refused")


@pytest.mark.parametrize("error,engine_ok,counted", [
    (KeyError("answer"), True, True),                                  # the user's generate function
    (EngineError("/generate", 400, "the prompt is longer than the context"), True, True),   # refused for good
    (ENGINE_DOWN, True, False),                                        # killed: the watcher has not noticed yet
    (EngineTimeout("/generate", None, "no answer within 600 s"), True, False),
    (EngineError("/generate", 503, "Service Unavailable"), True, False),
    (KeyError("answer"), False, False),                                # whatever fails while the engine restarts
    (None, True, False),                                               # aborted: given back, not failed
])
def test_a_group_whose_generation_raises_is_given_back_as_failed_unless_the_engine_was_out_of_reach(
        error, engine_ok, counted):
    """The buffer counts a group given back as failed (MAX_GROUP_ERRORS: the third time it is a failed group, and a
    rollout with --max-failed-groups of them fails the job) -- only when the failure is the group's: an engine out of
    reach (killed, restarting, timed out, 5xx) would otherwise fail every group in flight within the half second its
    watcher takes to notice, and the rollout with them. An aborted group is only given back."""
    from types import SimpleNamespace

    w = RolloutWorker(0, args=parse_config(["--config", DIGITS]).to_dict())
    w.buffer = buf = Buffer()
    w.generation = Generation(error)
    if engine_ok:
        w._engine_ok.set()
    group = SimpleNamespace(work_id="train-3", samples=[s.to_wire() for s in samples()], sampling_params={},
                            attempt=1, kind="train")
    asyncio.run(w._process_group(group))
    assert [a[:2] for a in buf.asks] == [("return_work", "train-3")]
    assert buf.asks[0][2] == (f"error: {error!r}" if error is not None else "aborted")
    assert (buf.asks[0][3:] == ("failed",)) == counted


def test_a_huge_error_is_cut_before_it_is_sent_back():
    """A user's function that raises with an enormous message (a whole sample in it): the group is given back with
    the first RETURN_REASON_CHARS characters of it, not a body of any size."""
    from types import SimpleNamespace

    w = RolloutWorker(0, args=parse_config(["--config", DIGITS]).to_dict())
    w.buffer = buf = Buffer()
    w.generation = Generation(ValueError("x" * 10_000_000))
    w._engine_ok.set()
    group = SimpleNamespace(work_id="train-3", samples=[s.to_wire() for s in samples()], sampling_params={},
                            attempt=1, kind="train")
    asyncio.run(w._process_group(group))
    (ask,) = buf.asks
    assert ask[2] == "error: ValueError('" + "x" * (rollout_module.RETURN_REASON_CHARS - len("error: ValueError('"))
    assert ask[3:] == ("failed",)
