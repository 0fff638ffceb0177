"""Rewards: built-in rules, remote_rm against a local server (retries, backoff, giving up), custom and group
functions, batch scoring, and the dynamic sampling filters."""

import asyncio
import functools
import json
import time

import pytest
from aiohttp import web

from slime_actors.filters import (DynamicFilter, FilterOutput, call_filter, check_reward_nonzero_std,
                                  check_reward_nonzero_std_with_fallback)
from slime_actors.rewards import (BUILTIN_RMS, RewardConfigError, RewardError, check_reward_args, close_sessions,
                                  compute_group_rewards, compute_reward, extract_boxed, register_reward, score_batch,
                                  score_samples, to_reward)
from slime_actors.rewards.remote import RemoteRMConfig, RemoteRMError, remote_rm
from slime_actors.actors.rollout import TEXT_ONLY_REWARDS
from slime_actors.types import Sample

from helpers import flat_args, untouchable


A = flat_args   # what reward functions and filters get: slime's `args`, the job config's flat view


def S(response, label=None, index=0, group_index=0, **kw):
    return Sample(index=index, group_index=group_index, prompt="q", response=response, label=label, **kw)


def score(rm_type, response, label, **kw):
    return asyncio.run(compute_reward(A(rm_type=rm_type, **kw), S(response, label)))


# --------------------------------------------------------------------------------------------------- rules

@pytest.mark.parametrize("text,want", [
    (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}"),
    (r"first \boxed{1} then \boxed{2}", "2"),
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
    (r"$\boxed 7$", "7"),
    (r"\fbox{x+1}", "x+1"),
    (r"\boxed{1", None),
    (r"\boxed{a} and \boxed{", "a"),
    ("no box here", None),
    ("", None),
])
def test_extract_boxed(text, want):
    assert extract_boxed(text) == want


@pytest.mark.parametrize("response,label,want", [
    (r"The answer is \boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"so \boxed{0.5}", r"\frac{1}{2}", 1.0),
    (r"\boxed{1/2}", r"\frac12", 1.0),
    (r"\boxed{\sqrt 2}", r"\sqrt{2}", 1.0),
    (r"\boxed{12}", 12, 1.0),                       # a numeric label
    (r"\boxed{4}", ["3", "4"], 1.0),                # any of several labels
    (r"\boxed{13}", "12", 0.0),
    (r"I first thought 12, but \boxed{13}", "12", 0.0),   # the box wins over loose numbers
    ("the result is 12", "12", 1.0),                # no box: math-verify's own extraction
    ("", "1", 0.0),
    ("!!! ???", "1", 0.0),
    (r"\boxed{", "1", 0.0),
    (r"\boxed{\frac{1}{2}}", "", 0.0),              # unparsable label
])
def test_math(response, label, want):
    assert score("math", response, label) == want


def test_deepscaler_uses_the_answer_after_thinking():
    assert score("deepscaler", r"<think>maybe \boxed{3}</think> \boxed{2}", "2") == 1.0
    assert score("deepscaler", r"<think>\boxed{2} still thinking", "2") == 0.0


@pytest.mark.parametrize("response,label,want", [
    (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}", 1.0),   # nested braces
    (r"\boxed{\dfrac{1}{2}}", r"\frac{1}{2}", 1.0),
    (r"\boxed{ 3 }", "$3$", 1.0),
    (r"\boxed{5}", r"\boxed{5}", 1.0),                  # a boxed label
    (r"\boxed{\text{Paris}}", "paris", 1.0),
    (r"\boxed{1} \boxed{2}", "1", 0.0),                 # the last box counts
    (r"\boxed{0.5}", r"\frac{1}{2}", 0.0),              # strings, not math
    ("5", "5", 0.0),                                    # no box
])
def test_boxed(response, label, want):
    assert score("boxed", response, label) == want


def test_exact_match_and_f1():
    assert score("exact_match", "  Paris \n", "Paris") == 1.0
    assert score("exact_match", "New   York", "New York") == 1.0
    assert score("exact_match", "paris", "Paris") == 0.0
    assert score("exact_match_ci", "PARIS", "paris") == 1.0
    assert score("exact_match", "Paris", ["Lyon", "Paris"]) == 1.0
    assert score("f1", "the cat sat", "a cat sat down") == pytest.approx(0.8)
    assert score("f1", "yes", "no") == 0.0 and score("f1", "Yes.", "yes") == 1.0
    assert score("f1", "dog", "cat") == 0.0
    assert score("boxed_f1", r"I say \boxed{the cat sat}", "a cat sat down") == pytest.approx(0.8)
    assert score("boxed_exact_match", r"words \boxed{42}", "42") == 1.0


def test_missing_label_and_unknown_type():
    with pytest.raises(RewardError) as e:
        asyncio.run(compute_reward(A(rm_type="math"), S(r"\boxed{1}", None, index=17)))
    assert e.value.rm_type == "math" and e.value.sample_index == 17 and "label" in str(e.value)
    assert "sample 17" in str(e.value)
    with pytest.raises(RewardConfigError, match="unknown reward type 'nope'"):
        asyncio.run(compute_reward(A(rm_type="nope"), S("x", "x")))
    with pytest.raises(RewardConfigError, match="unknown reward type"):
        check_reward_args(A(rm_type="nope"))
    with pytest.raises(RewardConfigError, match="--rm-type or --custom-rm-path"):
        check_reward_args(A())
    with pytest.raises(RewardConfigError, match="--rm-url"):
        check_reward_args(A(rm_type="remote_rm"))
    assert check_reward_args(A(rm_type="boxed_f1")) == "boxed_f1"


def test_per_sample_rm_type_and_registered_rewards():
    register_reward("always_seven", lambda args, s: 7)
    s = S("x", "y")
    s.metadata["rm_type"] = "always_seven"
    assert asyncio.run(compute_reward(A(rm_type="exact_match"), s)) == 7.0


def test_to_reward():
    assert to_reward(True) == 1.0 and to_reward(3) == 3.0
    assert to_reward({"reward": 0.5, "acc": 1}) == 0.5
    assert to_reward({"reward": 0.5, "acc": 1}, A(reward_key="acc")) == 1.0
    with pytest.raises(ValueError, match="--reward-key"):
        to_reward({"score": 1})
    for bad in ("1.0", None, [1]):
        with pytest.raises(TypeError):
            to_reward(bad)
    with pytest.raises(ValueError, match="finite"):
        to_reward(float("nan"))


# ------------------------------------------------------------------------------------------ text-only built-ins
@pytest.mark.parametrize("rm_type", sorted(TEXT_ONLY_REWARDS - {"remote_rm", "code"}) + ["boxed_f1", "boxed_dapo"])
def test_the_text_only_built_ins_read_no_token_list_and_score_as_with_them(rm_type):
    """actors/rollout.py sends these rewards' samples without token ids, loss mask and log-probs: each scores a sample
    whose token lists raise when read as it scores the full sample (remote_rm: below; code: tests/test_code_reward.py)."""
    for response, label in (("so the answer is \\boxed{7}", "7"), ("Answer: 8", "7"), ("", "7"), ("7", "7")):
        lean = untouchable(S(response, label))
        full = S(response, label, prompt_tokens=[1, 2], response_tokens=[3, 4], loss_mask=[1, 1],
                 rollout_log_probs=[-0.5, -0.25])
        got, want = (asyncio.run(compute_reward(A(rm_type=rm_type), x)) for x in (lean, full))
        assert got == want or rm_type == "random", (rm_type, response, got, want)
    assert TEXT_ONLY_REWARDS <= set(BUILTIN_RMS)


def test_a_built_in_name_cannot_be_registered_again():
    for name in ("math", "boxed_exact_match"):
        with pytest.raises(ValueError, match="built-in reward type's name"):
            register_reward(name, lambda args, s: 1.0)
    assert BUILTIN_RMS["math"].__name__ == "_math"


# --------------------------------------------------------------------------------------------------- remote_rm

class RMServer:
    """A reward model on 127.0.0.1 that fails `fail` times (status `fail_status`, or a hang past the client's
    timeout with `hang`), then answers `answer`. Records payloads and arrival times."""

    def __init__(self, fail=0, fail_status=500, answer=None, content_type="application/json", hang=0.0):
        self.fail, self.fail_status, self.hang = fail, fail_status, hang
        self.answer = {"reward": 0.75} if answer is None else answer
        self.content_type = content_type
        self.times, self.payloads = [], []

    async def handle(self, request):
        self.times.append(time.monotonic())
        self.payloads.append(await request.json())
        if len(self.times) <= self.fail:
            if self.hang:
                await asyncio.sleep(self.hang)
            return web.Response(status=self.fail_status, text="overloaded")
        body = self.answer if isinstance(self.answer, str) else json.dumps(self.answer)
        return web.Response(text=body, content_type=self.content_type)

    async def __aenter__(self):
        app = web.Application()
        app.router.add_post("/rm", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/rm"
        return self

    async def __aexit__(self, *exc):
        await close_sessions()
        await self.runner.cleanup()


@pytest.fixture(autouse=True)
def _restore_remote_rm(monkeypatch):
    monkeypatch.setitem(BUILTIN_RMS, "remote_rm", BUILTIN_RMS["remote_rm"])   # restored after each test


def rargs(url, reward_key=None, **settings):
    """--rm-type remote_rm --rm-url URL, the remote reward's retry settings (RemoteRMConfig's, not flags) as given:
    the built-in is the same function with its `config`."""
    settings.setdefault("backoff_base", 0.02)
    settings.setdefault("max_attempts", 4)
    BUILTIN_RMS["remote_rm"] = functools.partial(remote_rm, config=RemoteRMConfig(url, **settings))
    return A(rm_type="remote_rm", rm_url=url, reward_key=reward_key)


def test_remote_rm_takes_the_url_flag():
    assert RemoteRMConfig.from_args(A(rm_type="remote_rm", rm_url="http://h:1/rm")) == RemoteRMConfig("http://h:1/rm")
    with pytest.raises(RemoteRMError, match="--rm-url"):
        RemoteRMConfig.from_args(A(rm_type="remote_rm"))


def test_remote_rm_retries_then_succeeds():
    async def main():
        async with RMServer(fail=2) as srv:
            s = untouchable(S("resp", "lab", index=3, metadata={"k": 1}))   # (it reads no token list)
            r = await compute_reward(rargs(srv.url), s)
            return r, srv
    r, srv = asyncio.run(main())
    assert r == 0.75
    assert len(srv.times) == 3                       # two failures, then the answer
    assert srv.payloads[-1] == {"prompt": "q", "response": "resp", "label": "lab", "metadata": {"k": 1}}


def test_remote_rm_gives_up_after_n_attempts_with_backoff():
    async def main():
        async with RMServer(fail=100, fail_status=503) as srv:
            with pytest.raises(RewardError) as e:
                await compute_reward(rargs(srv.url, backoff_base=0.04, max_attempts=4), S("r", "l", index=9))
            return e.value, srv
    err, srv = asyncio.run(main())
    assert len(srv.times) == 4
    assert err.rm_type == "remote_rm" and err.sample_index == 9
    assert "after 4 attempts" in str(err) and "503" in str(err) and srv.url in str(err)
    gaps = [b - a for a, b in zip(srv.times, srv.times[1:])]
    for k, gap in enumerate(gaps):                   # exponential, jittered in [0.5, 1) of 0.04 * 2**k
        assert 0.5 * 0.04 * 2 ** k - 0.005 <= gap < 0.04 * 2 ** k + 0.5, gaps
    assert gaps[2] > gaps[0]


def test_remote_rm_timeouts_and_refused_connections_are_retried():
    async def main():
        async with RMServer(fail=1, hang=1.0) as srv:   # the first request hangs past rm_timeout
            r = await compute_reward(rargs(srv.url, timeout=0.2), S("r", "l"))
            assert r == 0.75 and len(srv.times) == 2
        # nothing listens on this port any more: connection refused, every time
        with pytest.raises(RewardError) as e:
            await compute_reward(rargs(srv.url, max_attempts=3), S("r", "l"))
        await close_sessions()
        return e.value
    err = asyncio.run(main())
    assert "after 3 attempts" in str(err) and "Connect" in str(err)


def test_remote_rm_answers():
    async def main(answer, content_type="application/json", **kw):
        async with RMServer(answer=answer, content_type=content_type) as srv:
            try:
                return await compute_reward(rargs(srv.url, **kw), S("r", "l")), len(srv.times)
            except RewardError as e:
                return e, len(srv.times)
    assert asyncio.run(main(0.5)) == (0.5, 1)                          # a bare JSON number
    assert asyncio.run(main("0.25", "text/plain")) == (0.25, 1)        # a bare number as text
    assert asyncio.run(main({"score": 2, "reward": 1}, reward_key="score")) == (2.0, 1)
    err, n = asyncio.run(main("not a number", "text/plain"))
    assert isinstance(err, RewardError) and "not JSON and not a number" in str(err) and n == 1   # not retried
    err, n = asyncio.run(main({"other": 1}))
    assert isinstance(err, RewardError) and "--reward-key" in str(err)


def test_remote_rm_answers_past_a_mebibyte_are_not_read(monkeypatch):
    """A server that answers 5 MiB -- with its length, or chunked without one -- fails the sample at once, naming the
    bound; the reward worker never holds more than the bound (and a chunk) of it."""
    import slime_actors.rewards.remote as remote
    seen = []
    real = remote._read_answer

    async def counting(resp, url, limit=remote.MAX_ANSWER_BYTES):
        try:
            return await real(resp, url, limit)
        finally:
            seen.append(resp.content.total_bytes)
    monkeypatch.setattr(remote, "_read_answer", counting)

    async def main(chunked):
        big = {"reward": 1.0, "pad": "x" * (5 << 20)}

        async def handle(request):
            if not chunked:
                return web.json_response(big)
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for _ in range(80):
                await resp.write(b"x" * (64 << 10))
            return resp
        app = web.Application()
        app.router.add_post("/rm", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/rm"
        try:
            with pytest.raises(RewardError) as e:
                await compute_reward(rargs(url), S("r", "l"))
            return str(e.value)
        finally:
            await close_sessions()
            await runner.cleanup()
    for chunked in (False, True):
        msg = asyncio.run(main(chunked))
        assert "answered HTTP 200 with more than 1,048,576 bytes; a reward is a number or a small JSON object (not " \
               "retried)" in msg, msg
        # read no further than the bound, a chunk and what the stream had buffered (a socket read is up to 256 KiB):
        # far from the 5 MiB sent
        assert seen[-1] < 2 << 20, seen
    assert len(seen) == 2   # one attempt each: not retried


def test_remote_rm_client_errors_are_not_retried():
    async def main():
        async with RMServer(fail=5, fail_status=400) as srv:
            with pytest.raises(RewardError, match="HTTP 400"):
                await compute_reward(rargs(srv.url), S("r", "l"))
            return len(srv.times)
    assert asyncio.run(main()) == 1


# --------------------------------------------------------------------------------------------------- custom

CUSTOM = '''
import asyncio
async def ascore(args, sample):
    await asyncio.sleep(0)
    return len(sample.response)
def sscore(args, sample):
    return {"reward": 0.0, "acc": 1.0}
def boom(args, sample):
    raise ZeroDivisionError("bad sample " + str(sample.index))
def text(args, sample):
    return "high"
async def group(args, samples):
    return [float(i) for i, _ in enumerate(samples)]
def short_group(args, samples):
    return [1.0]
NOT_A_FUNCTION = 3
'''


@pytest.fixture
def custom(tmp_path):
    f = tmp_path / "my_rm.py"
    f.write_text(CUSTOM)
    return lambda name: f"{f}:{name}"


def test_custom_functions(custom):
    run = lambda path, s, **kw: asyncio.run(compute_reward(A(custom_rm_path=path, **kw), s))  # noqa: E731
    assert run(custom("ascore"), S("abcd")) == 4.0                    # async
    assert run(custom("sscore"), S("x")) == 0.0                       # sync, dict -> "reward"
    assert run(custom("sscore"), S("x"), reward_key="acc") == 1.0
    with pytest.raises(RewardError) as e:
        run(custom("boom"), S("x", index=5))
    assert e.value.sample_index == 5 and isinstance(e.value.cause, ZeroDivisionError)
    assert custom("boom") in str(e.value) and "bad sample 5" in str(e.value)
    with pytest.raises(RewardError, match="expected a number"):
        run(custom("text"), S("x"))


def test_custom_loading_errors(custom, tmp_path):
    for path, kind in [(custom("missing_fn"), "has no attribute 'missing_fn'"),
                       (custom("NOT_A_FUNCTION"), "not callable"),
                       (str(tmp_path / "absent.py") + ":f", "not found"),
                       ("no_such_module_q.f", "not found")]:
        with pytest.raises(RewardConfigError) as e:
            asyncio.run(compute_reward(A(custom_rm_path=path), S("x")))
        assert kind in str(e.value) and "--custom-rm-path" in str(e.value)
        with pytest.raises(RewardConfigError):
            check_reward_args(A(custom_rm_path=path))


def test_group_rm(custom):
    samples = [S("a", index=10 + i, group_index=1) for i in range(4)]
    args = A(custom_rm_path=custom("group"), group_rm=True)
    assert asyncio.run(compute_group_rewards(args, samples)) == [0.0, 1.0, 2.0, 3.0]
    assert asyncio.run(compute_reward(args, samples[0])) == 0.0       # a one-sample group
    with pytest.raises(RewardError) as e:
        asyncio.run(compute_group_rewards(A(custom_rm_path=custom("short_group"), group_rm=True), samples))
    assert e.value.sample_index == [10, 11, 12, 13] and "1 rewards for 4 samples" in str(e.value)
    # built-ins under --group-rm: each sample on its own
    assert asyncio.run(compute_group_rewards(A(rm_type="exact_match", group_rm=True),
                                             [S("a", "a"), S("b", "a")])) == [1.0, 0.0]
    assert asyncio.run(compute_group_rewards(args, [])) == []


# --------------------------------------------------------------------------------------------------- batches

def test_score_batch_keeps_failures_per_sample(tmp_path):
    f = tmp_path / "batch_rm.py"
    f.write_text('''
import asyncio
state = {"now": 0, "max": 0}
async def fn(args, sample):
    state["now"] += 1
    state["max"] = max(state["max"], state["now"])
    await asyncio.sleep(0.01 if sample.response != "slow" else 5)
    state["now"] -= 1
    if sample.response == "bad":
        raise ValueError("cannot score")
    return 1.0
''')
    samples = [S("ok", index=i) for i in range(12)]
    samples[3].response = "bad"
    samples[7].response = "slow"
    args = A(custom_rm_path=f"{f}:fn")
    t0 = time.monotonic()
    rewards, errors = asyncio.run(score_batch(args, samples, concurrency=3, timeout=0.3))
    assert time.monotonic() - t0 < 3
    assert [i for i, e in enumerate(errors) if e] == [3, 7]
    assert rewards[3] is None and rewards[7] is None and all(r == 1.0 for i, r in enumerate(rewards) if i not in (3, 7))
    assert isinstance(errors[3].cause, ValueError) and errors[3].sample_index == 3
    assert isinstance(errors[7].cause, TimeoutError) and "within 0.3 s" in str(errors[7])
    import sys
    mod = [m for n, m in sys.modules.items() if n.startswith("slime_actors_plugin_batch_rm_")][0]
    assert mod.state["max"] == 3                     # the concurrency bound held
    # messages-friendly variant: errors as strings
    rewards, errs = asyncio.run(score_samples(A(rm_type="exact_match"), [S("a", "a"), S("b", None, index=1)]))
    assert rewards == [1.0, None] and errs[0] is None and "sample 1" in errs[1]


def test_score_batch_group_mode(custom):
    samples = [S("x", index=i, group_index=i // 2) for i in range(6)]
    rewards, errors = asyncio.run(score_batch(A(custom_rm_path=custom("group"), group_rm=True), samples))
    assert rewards == [0.0, 1.0] * 3 and errors == [None] * 6
    rewards, errors = asyncio.run(score_samples(A(custom_rm_path=custom("short_group")), samples, group=True))
    assert rewards == [None] * 6 and all("1 rewards for 2 samples" in e for e in errors)
    with pytest.raises(RewardConfigError):
        asyncio.run(score_batch(A(rm_type="nope"), samples))


# --------------------------------------------------------------------------------------------------- filters

def group(*rewards):
    return [Sample(index=i, group_index=0, reward=r) for i, r in enumerate(rewards)]


def test_check_reward_nonzero_std():
    args = A()
    assert check_reward_nonzero_std(args, group(1.0, 0.0, 1.0))
    out = check_reward_nonzero_std(args, group(1.0, 1.0, 1.0))
    assert not out and out.reason == "zero_std_1.0"
    assert not check_reward_nonzero_std(args, group(0.0, 0.0))
    assert not check_reward_nonzero_std(args, group(0.5))
    assert check_reward_nonzero_std_with_fallback(args, group(0, 0)).keep_when_insufficient
    with pytest.raises(ValueError, match="no reward"):
        check_reward_nonzero_std(args, group(1.0, None))


def test_dynamic_filter_by_path(tmp_path):
    f = DynamicFilter("slime_actors.filters.check_reward_nonzero_std")
    assert f(A(), group(0, 1)) and not f(A(), group(1, 1)) and not f(A(), group(0, 0))
    assert f.metrics() == {"rollout/dynamic_filter/kept": 1, "rollout/dynamic_filter/drop_zero_std_1.0": 1,
                           "rollout/dynamic_filter/drop_zero_std_0.0": 1}
    p = tmp_path / "flt.py"
    p.write_text("def keep_long(args, samples):\n    return len(samples) > 2\n")
    f = DynamicFilter(f"{p}:keep_long")
    assert f(A(), group(1, 1, 1)).keep and f(A(), group(1)) == FilterOutput(False, "filtered")
    assert call_filter(None, A(), group(1)).keep
    assert DynamicFilter(None).fn is None
    with pytest.raises(ImportError, match="--dynamic-sampling-filter-path"):
        DynamicFilter("slime_actors.filters.no_such_filter")


def test_remote_rm_flags_timeout_attempts_and_headers(monkeypatch):
    """--rm-timeout, --rm-max-attempts and --rm-headers (${NAME} read from the reward worker's environment, so the
    token is in no job file) reach the requests."""
    monkeypatch.setenv("RM_TOKEN", "s3cret")
    seen = []

    class HeaderServer(RMServer):
        async def handle(self, request):
            seen.append(dict(request.headers))
            return await super().handle(request)

    async def main():
        async with HeaderServer(fail=1, hang=1.0) as srv:
            a = A(rm_type="remote_rm", rm_url=srv.url, rm_timeout=0.2, rm_max_attempts=2,
                  rm_headers='{"Authorization": "Bearer ${RM_TOKEN}", "X-Team": "rl"}')
            cfg = RemoteRMConfig.from_args(a)
            assert (cfg.timeout, cfg.max_attempts) == (0.2, 2)
            return await compute_reward(a, S("r", "l")), len(srv.times)
    r, n = asyncio.run(main())
    assert r == 0.75 and n == 2                       # the first attempt timed out after 0.2 s, the second answered
    assert seen[-1]["Authorization"] == "Bearer s3cret" and seen[-1]["X-Team"] == "rl"
    monkeypatch.delenv("RM_TOKEN")
    with pytest.raises(RemoteRMError, match=r"--rm-headers refers to \$\{RM_TOKEN\}, which is not set"):
        RemoteRMConfig.from_args(A(rm_type="remote_rm", rm_url="http://h/rm",
                                   rm_headers='{"Authorization": "Bearer ${RM_TOKEN}"}'))


def test_remote_rm_header_flag_is_checked_at_start():
    from slime_actors.config import ConfigError, JobConfig
    base = {"prompt_data": "p.jsonl", "hf_checkpoint": "tiny:x", "rm_type": "remote_rm", "rm_url": "http://h/rm"}
    with pytest.raises(ConfigError, match="--rm-headers must be a JSON object"):
        JobConfig.from_dict({**base, "rm_headers": "Authorization: x"})
    with pytest.raises(ConfigError, match="--rm-headers: header 'X' must be a string"):
        JobConfig.from_dict({**base, "rm_headers": '{"X": 1}'})
