"""A rollout worker: one generation engine process (the local engine or SGLang) and the generate -> score -> submit
path of the groups it is given.

It pulls prompt groups from the buffer (bounded by `--rollout-concurrency` samples in flight), generates
`n_samples_per_prompt` responses per prompt through the engine (actors/rollout_generate.py: the built-in path, an
environment's episodes, the user's generate functions), has a reward worker score them, and hands the group back.
Work it cannot finish -- the rollout ended, the engine died or hung -- goes back to the buffer (with partial
responses under --partial-rollout), so nothing is lost.

The engine is supervised by the worker's other half (actors/rollout_engine.py): if its process exits, or (with
--use-fault-tolerance) it fails `/health_generate`, it is killed and started again, and the controller re-syncs it
to the current weight version before it serves.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from ..episode_samples import episode_of
from ..eval_config import EVAL_SET_KEY
from ..mailbox.errors import MailboxError, RemoteError, transient
from ..messages import Scores, WorkGroup
from ..retry import RetryPolicy, retry
from ..role_handles import BufferHandle, ControllerHandle, RewardHandle
from ..tokenizer import load_tokenizer as _load_tokenizer
from ..types import ABORTED, FAILED, Sample
from .base import Actor, handler
from .rollout_engine import EngineSupervisor, preimport_engine_path
from .rollout_generate import EngineHandle, Generation, generate_style, request_key

if TYPE_CHECKING:
    from .rollout_retrieval import RetrieverLink

__all__ = ["RolloutWorker", "EngineHandle", "generate_style", "request_key", "submit_key"]

REWARD_WAIT_S = 300.0  # how long a rollout worker keeps asking while no reward worker answers at all
# asks to the buffer, repeated while it restarts (any mailbox error, as a restart can answer with one)
RELEASE_RETRY = RetryPolicy(attempts=5, base=0.5, factor=2.0, max_delay=5.0, retry_on=(MailboxError,))
# (a submit the buffer's handler refused -- samples it cannot take -- gets the same answer again: not repeated)
SUBMIT_RETRY = RetryPolicy(attempts=20, base=0.2, factor=2.0, max_delay=5.0, retry_on=(MailboxError,),
                           retry_if=transient)
RETURN_RETRY = RetryPolicy(attempts=10, base=0.2, factor=2.0, max_delay=5.0, retry_on=(MailboxError,))
RETURN_REASON_CHARS = 2000   # (the buffer keeps as much of a failed group's error)
AHEAD_RETRY = RetryPolicy(attempts=3, base=0.2, factor=2.0, max_delay=1.0, retry_on=(MailboxError,))


def submit_key(work_id: str, lease: int, first: Sample) -> str:
    """The idempotency key of a group's submission: a retry of the same submission (its reply lost on a cut link)
    gets the buffer's cached answer, while the same group leased again -- `lease` is the buffer's count of its
    leases, the group's `attempt` -- is a new submission. (Without the lease, a group re-issued while its first
    submission was in flight, then leased back to the same worker, found its new submission answered with the
    first one's refusal from the cache, and stayed leased to a worker that had let it go.)"""
    return f"{work_id}:{lease}:{first.index}:{first.weight_version}:{len(first.response_tokens)}"


class RolloutWorker(EngineSupervisor, Actor):
    role = "rollout"
    needs_job = True

    def __init__(self, index: int = 0, **config):
        super().__init__(index, **config)
        self.plugin_args = self.cfg.flat()   # what custom generate / rollout functions get (slime's `args`)
        self._init_engine_state()
        self.tokenizer = None
        self.generation = Generation(self)
        self.retriever: RetrieverLink | None = None  # (actors/rollout_retrieval.py) when the job has a retriever
        self._inflight: dict[str, asyncio.Task] = {}
        # groups of a rollout made ahead, leased while the trainers train (take_ahead), and the weight version each
        # waits for: started at the first resume whose engine holds it
        self._ahead: dict[str, tuple[WorkGroup, int | None]] = {}
        self._rollouts_ended = 0          # end_rollout calls: a take_ahead answered after one gives its groups back
        self._capacity = 0                # samples generated at once (--rollout-concurrency)
        self._generating = 0              # samples being generated now (not Actor._busy: handlers running)
        self.counters.update({"groups": 0, "samples": 0, "aborted_groups": 0, "reward_retries": 0, "env_errors": 0})
        self.buffer, self.controller = BufferHandle(self, "buffer/0"), ControllerHandle(self, "controller/0")
        self._text_only = _text_only_graders(self.cfg)   # whose samples go to the reward without their token lists

    # ------------------------------------------------------------------------------------------ lifecycle
    async def on_start(self) -> None:
        cfg = self.cfg
        self._capacity = max(cfg.engine.rollout_concurrency, cfg.rollout.n_samples_per_prompt,
                             cfg.eval.n_samples_per_eval_prompt)
        from ..backends.engine_auth import EngineKeys
        self.keys = EngineKeys.from_env() or EngineKeys()  # the launcher's; none: --engine-auth false
        # the engine, the longest part of this worker's start, boots while its flags are checked on this host and the
        # tokenizer and the user's functions load: launched first (its command needs nothing of the tokenizer), waited
        # for last. The tokenizer loads off the loop (importing transformers takes seconds; heartbeats keep going), and
        # everything the loop runs meanwhile is imported before that thread starts -- an import on the loop would wait
        # on the module locks the thread holds (a silent actor, declared down under load). A bad user function or
        # tokenizer still fails the start with its own error, before the engine is waited for, and the engine launched
        # is stopped. A previous process's groups are released meanwhile, without waiting on the buffer (it answers once
        # it has loaded its prompts): other workers can take them, and this one pulls only once the engine serves (the
        # pull loop, spawned below, is the only place this worker asks for work)
        from .. import startup_timeline as timeline
        preimport_engine_path()
        release = self.spawn(self._release_previous(), name="release-previous")
        try:
            with timeline.phase("engine start"):   # launch -> serving; the phases below run alongside it
                try:
                    port = await self._launch_engine()
                    await self._check_launched_engine()   # (its flags: while the engine starts)
                    self.tokenizer = await self.run_blocking(_timed, "tokenizer", _load_tokenizer,
                                                             cfg.model.hf_checkpoint)
                    with timeline.phase("user functions"):
                        self.generation.load()
                    await self._start_router()
                except BaseException:
                    await self._stop_engine()   # (the engine launched, the router started: none left behind)
                    raise
                await self._engine_serving(port)
            await release
        finally:
            release.cancel()   # (a failed start: its cause is the engine's; a finished task ignores this)
        await self.generation.start()
        self.spawn(self._pull_loop(), name="pull")
        self.spawn(self._watch_engine(), name="engine-watch")

    async def on_stop(self) -> None:
        self._restarting = True  # the engine's exit from here on is expected
        for t in list(self._inflight.values()):
            t.cancel()
        await self._stop_engine()
        await self.generation.stop()

    async def job_failed(self, error: str) -> None:
        """This worker cannot go on (--env-error stop): the controller ends the job with `error`; stop pulling."""
        self._resumed.clear()
        try:
            await self.controller.tell.rollout_failed(self.name, error)
        except MailboxError as exc:
            self.log.error("could not tell the controller to stop the job", error=str(exc))

    async def _release_previous(self) -> None:
        """A new incarnation holds no work: whatever the buffer still has leased to this name (a previous process
        of it was killed) is re-issued now, before this one pulls (same sender, so no race with get_work)."""
        try:
            res = await retry(lambda: self.buffer.release_worker(self.name, reason="restarted", ask_timeout=30),
                              RELEASE_RETRY, what="release_worker (a previous incarnation's groups)", log=self.log,
                              clock=self.monotonic)  # (recorded clock readings, as every retry's here)
        except MailboxError as exc:  # (leases do not run out: a restarted buffer reconciles them -- held_groups)
            self.log.warning("could not release a previous incarnation's groups", error=str(exc))
            return
        if res.requeued:
            self.log.warning("re-issued the groups of this worker's previous process", groups=res.requeued)

    # ------------------------------------------------------------------------------------------ work
    async def _pull_loop(self) -> None:
        poll_key, poll_seq = None, 0
        pid = self.recorded("pid", os.getpid)  # in the idempotency keys (a restarted worker's keys are new)
        while True:
            await self._resumed.wait()
            await self._engine_ok.wait()
            free = self._free_groups()
            if free < 1:
                await asyncio.sleep(0.01)
                continue
            restarts = self.engine_restarts
            if poll_key is None:
                poll_seq += 1
                poll_key = f"get_work:{pid}:{poll_seq}"
            try:
                # an idempotency key: if the reply is lost (a cut link, a reconnect) the retry gets the same groups
                # from the buffer's cache instead of leaving them leased to us and never seen
                work = await self.buffer.get_work(self.name, free, wait=1.0, ask_timeout=10, idem=poll_key)
            except MailboxError as exc:
                if isinstance(exc, RemoteError):
                    poll_key = None
                self.log.warning("get_work failed; retrying", error=str(exc))
                await asyncio.sleep(0.5)
                continue
            poll_key = None
            if restarts != self.engine_restarts or not self._engine_ok.is_set():
                # the engine failed while we asked: this work must not run on the new engine before its re-sync
                for group in work.groups:
                    self.spawn(self._return(group.work_id, None, "engine restarted"), name="return")
                continue
            for group in work.groups:
                self._start_group(group)
            # (the groups start -- each counts its samples as generating -- before this loop asks for more)
            await asyncio.sleep(0)

    def _free_groups(self) -> int:
        """How many more groups this worker generates at once (--rollout-concurrency samples, a group's at a time)."""
        return (self._capacity - self._generating) // max(1, self.cfg.rollout.n_samples_per_prompt)

    def _start_group(self, group: WorkGroup) -> None:
        self._inflight[group.work_id] = self.spawn(self._process_group(group), name=f"group:{group.work_id}")

    @handler
    async def take_ahead(self, rollout_id: int) -> None:
        """Rollout `rollout_id` was made ahead (the buffer holds it while the trainers train on the one before): take
        as many of its groups as this worker generates at once, and start them at the first resume whose engine
        holds their weights -- the step's first requests then go out when the resume arrives, not after a get_work
        and its groups' decoding. Groups it cannot take now are pulled when the rollout opens, as ever."""
        free = self._free_groups() - len(self._ahead)
        if free < 1 or not self._engine_ok.is_set():
            return
        restarts, ended = self.engine_restarts, self._rollouts_ended
        pid = self.recorded("pid", os.getpid)
        try:
            # (an idempotency key: a retry after a lost reply gets the same groups, not a second lease)
            work = await retry(lambda: self.buffer.get_work(self.name, free, ahead=True, ask_timeout=10,
                                                            idem=f"take_ahead:{pid}:{rollout_id}"),
                               AHEAD_RETRY, what="get_work (ahead)", log=self.log, clock=self.monotonic)
        except MailboxError as exc:
            self.log.warning("could not take groups ahead; they are pulled when the rollout opens", error=str(exc))
            # the buffer may have leased groups whose reply never came: with nothing else leased to this worker
            # (between rollouts), releasing its leases re-issues them -- else the rollout would wait for them
            if not self._inflight and not self._ahead:
                try:
                    await self.buffer.release_worker(self.name, reason="take_ahead unanswered", ask_timeout=30)
                except MailboxError as again:   # (a restarted buffer asks which groups this worker holds)
                    self.log.warning("could not release groups taken ahead", error=str(again))
            return
        if restarts != self.engine_restarts or not self._engine_ok.is_set() or ended != self._rollouts_ended:
            # the engine restarted meanwhile (its release re-issued them), or a rollout was ended (a step failed:
            # what this worker held went back, and the buffer may be rolled back): not kept
            for group in work.groups:
                self.spawn(self._return(group.work_id, None, "taken ahead, then ended"), name="return")
            return
        for group in work.groups:
            self._ahead[group.work_id] = (group, work.weight_version)
        self._on_resumed()

    def _on_resumed(self) -> None:
        """Resumed (or groups taken ahead while resumed): the groups taken ahead whose weights the engine holds
        start now."""
        if not self._resumed.is_set():
            return
        for wid, (group, version) in list(self._ahead.items()):
            if version is None or version <= self.weight_version:
                del self._ahead[wid]
                self._start_group(group)

    async def _process_group(self, group: WorkGroup) -> None:
        wid = group.work_id
        samples = [Sample.from_wire(s) for s in group.samples]
        sp = dict(group.sampling_params)
        n = len(samples)
        self._generating += n
        try:
            try:
                samples = await self.generation.group(samples, sp, group.attempt, group.kind, wid)
            finally:
                self._generating -= n
            if any(s.status == ABORTED for s in samples):
                # (an environment's episode, or one that made several samples, cannot be continued -- its state is
                # gone --: it goes back unstarted)
                whole = self.generation.env is None and self.generation.agent_fn is None \
                    and not any(episode_of(s) is not None for s in samples)
                await self._return(wid, samples if whole else None, "aborted")
                return
            await self._score(samples, group.kind)
            self.counters["groups"] += 1
            self.counters["samples"] += n
            await self._submit(wid, samples, group.attempt)
        except asyncio.CancelledError:
            # the engine is being restarted or the worker stops: the buffer gets the group back via release_worker
            raise
        except Exception as exc:  # give the group back, it will be generated again -- when the error is the group's
            # (not an engine out of reach), up to the buffer's limit (MAX_GROUP_ERRORS: then the group is failed; a
            # rollout with too many fails the job)
            why = f"error: {exc!r}"[:RETURN_REASON_CHARS]
            self.log.error("group failed; returning it", work_id=wid, error=why)
            await self._return(wid, None, why, failed=self._groups_fault(exc))
        finally:
            self._inflight.pop(wid, None)

    async def _generate(self, sample: Sample, sp: dict, attempt: int, evaluation: bool = False,
                        work_id: str = "") -> Sample | list[Sample]:
        return await self.generation.sample(sample, sp, attempt, evaluation, work_id)

    async def _ask_reward(self, who: str, todo: list[Sample]) -> Scores:
        """One score ask; while no reward worker answers at all (killed, restarting) keep trying for up to
        REWARD_WAIT_S seconds -- scoring is pure, so a retry is harmless -- instead of
        spending the group's attempts, which are for reward functions that fail."""
        cfg = self.cfg
        wait = REWARD_WAIT_S
        t0 = None  # from the first failure (a recorded clock reading: replay takes the same turns)
        k = 0
        while True:
            target = who if k == 0 else f"reward/{(self.index + k) % max(1, cfg.reward.num_reward_workers)}"
            try:
                return await RewardHandle(self, target).score([self._score_wire(s) for s in todo],
                                                        group=cfg.reward.group_rm, ask_timeout=300)
            except MailboxError as exc:
                if isinstance(exc, RemoteError) and exc.type != "MailboxError":
                    raise
                if t0 is None:
                    t0 = self.monotonic()
                elif self.monotonic() - t0 > wait:
                    raise
                k += 1
                self.log.warning("reward worker unavailable; retrying", reward=target, error=str(exc))
                await asyncio.sleep(min(2.0, 0.2 * k))

    def _score_wire(self, s: Sample) -> dict:
        """A sample as the reward worker gets it: without its token ids, loss mask and log-probs when its grader is a
        built-in that reads none of them (a group's body a quarter of the size: less to encode here and to decode
        there, at the end of a rollout, when the last groups' scoring is what the step waits for)."""
        wire = s.to_wire()
        meta = s.metadata if isinstance(s.metadata, dict) else {}
        grader = meta.get(EVAL_SET_KEY)
        lean = self._text_only.get(grader) if grader in self._text_only else self._text_only.get("")
        row_type = meta.get("rm_type")   # (a row's own type comes before the set's or the job's: rewards/dispatch.py)
        if lean and (row_type is None or text_only(row_type)):
            for key in TOKEN_FIELDS:
                del wire[key]
        return wire

    async def _score(self, samples: list[Sample], kind: str) -> None:
        cfg = self.cfg
        todo = [s for s in samples if s.status != FAILED]
        generation = self.generation
        own = generation.env is not None or generation.agent_fn is not None or any(episode_of(s) is not None for s in samples)
        if own and not (cfg.reward.group_rm and any(s.reward is None for s in todo)):
            # an environment's or an agent's reward stands, and so do those an episode of several samples gave
            todo = [s for s in todo if s.reward is None]
        last_errors: dict[int, str] = {}
        for attempt in range(3):
            if not todo:
                return
            who = f"reward/{(self.index + attempt) % max(1, cfg.reward.num_reward_workers)}"
            try:
                res = await self._ask_reward(who, todo)
            except MailboxError as exc:
                self.log.warning("reward worker unavailable; trying another", reward=who, error=str(exc))
                for s in todo:
                    last_errors[s.index] = f"{who}: {exc}"
                self.counters["reward_retries"] += 1
                await asyncio.sleep(0.2 * (attempt + 1))
                continue
            failed = []
            timed_out = res.timed_out   # [] when a reward actor of your own leaves it out
            for i, (s, r, e) in enumerate(zip(todo, res.rewards, res.errors)):
                if e is None and r is not None:
                    s.reward = float(r)
                    if i < len(timed_out) and timed_out[i]:
                        s.metadata["reward_timed_out"] = True
                else:
                    last_errors[s.index] = e or "no reward"
                    failed.append(s)
            if failed and attempt < 2:
                self.counters["reward_retries"] += 1
            todo = failed if not cfg.reward.group_rm else (samples if failed else [])
        for s in todo:  # still failing after retries: the group is recorded as failed (buffer keeps it)
            s.status = FAILED
            s.error = f"reward failed: {last_errors.get(s.index, 'unknown')}"

    async def _submit(self, wid: str, samples: list[Sample], lease: int) -> None:
        wire = [s.to_wire() for s in samples]
        idem = submit_key(wid, lease, samples[0])
        try:  # the buffer may be restarting: keep the group and try again (the same key: applied at most once)
            res = await retry(lambda: self.buffer.submit(self.name, wid, wire, ask_timeout=60, idem=idem),
                              SUBMIT_RETRY, what="submit", log=self.log, clock=self.monotonic, work_id=wid)
        except MailboxError as exc:
            if transient(exc):   # (the buffer did not answer for a minute: a restarted one asks which groups this
                # worker holds -- held_groups -- and re-issues this one)
                self.log.error("gave up submitting a group; a restarted buffer re-issues it", work_id=wid,
                               error=str(exc))
                return
            # its handler raised (samples it cannot take): the group goes back to be generated again, else it would
            # stay leased to this worker -- leases do not run out -- and the rollout would wait for it
            self.log.error("the buffer refused a group's samples; giving it back", work_id=wid, error=str(exc))
            await self._return(wid, None, f"submit refused: {exc}", failed=True)
            return
        if not res.accepted:
            self.log.warning("buffer refused a group", work_id=wid, reason=res.reason)

    def _groups_fault(self, exc: Exception) -> bool:
        """Whether a group's generation failed for a reason of its own -- the user's generate function or agent
        raised, the engine refused the request (HTTP 4xx) -- which counts toward the group's failures, or because
        the engine was out of reach: not serving (killed, restarting: the watcher has not noticed yet), timed out,
        answered 5xx, the connection failed. Those do not count: an engine restart would fail every group in flight
        within the watcher's half second. An answer over the client's bound counts too: the engine would send it
        again, and the group would be generated for ever."""
        from ..backends.engine_client import EngineAnswerTooLarge, EngineError, EngineTimeout, EngineUnavailable
        if not self._engine_ok.is_set() or self._restarting:
            return False
        if isinstance(exc, (EngineUnavailable, EngineTimeout)):
            return False
        if isinstance(exc, EngineAnswerTooLarge):
            return True
        if isinstance(exc, EngineError):
            return exc.status is not None and 400 <= exc.status < 500
        return True

    async def _return(self, wid: str, samples: list[Sample] | None, reason: str, failed: bool = False) -> None:
        """Give group `wid` back to the buffer (`failed`: it failed, `reason` says how; else aborted or not started).
        The reason is cut to RETURN_REASON_CHARS: an exception's text is the user's code's, of any size."""
        self.counters["aborted_groups"] += 1
        reason = reason[:RETURN_REASON_CHARS]
        given: dict = {"reason": reason} if samples is None else {"reason": reason,
                                                                  "samples": [s.to_wire() for s in samples]}
        if failed:
            given["failed"] = True
        try:
            await retry(lambda: self.buffer.return_work(self.name, wid, **given, ask_timeout=30), RETURN_RETRY,
                        what="return_work", log=self.log, clock=self.monotonic, work_id=wid)
        except MailboxError as exc:
            # (leases do not run out: the group stays leased to this worker until its leases are released -- an
            # engine or worker restart -- or a restarted buffer reconciles them: held_groups no longer names it)
            self.log.warning("gave up returning a group", work_id=wid, error=str(exc))

    @handler
    async def end_rollout(self, rollout_id: int) -> dict:
        """Stop pulling, abort generation in flight, wait until those groups went back to the buffer (with the groups
        taken ahead and not started: the next rollout's, given back too -- a rollout made ahead is ended only when a
        step fails and is done again)."""
        self._resumed.clear()
        self._rollouts_ended += 1
        for wid in list(self._ahead):
            del self._ahead[wid]
            await self._return(wid, None, "rollout ended")
        n = len(self._inflight)
        if n:
            await self.engine_client.abort_request(abort_all=True)
            deadline = self.monotonic() + 60  # recorded clock readings: replay takes the same turns
            while self._inflight and self.monotonic() < deadline:
                await asyncio.sleep(0.01)
        await self._engine_profile(rollout_id + 1)
        return {"aborted": n, "returned": n - len(self._inflight)}

    @handler
    def held_groups(self) -> list:
        """Work ids this worker holds (generating, scoring or handing in; taken ahead): the buffer reconciles after a
        restart."""
        return sorted([*self._inflight, *self._ahead])


# The built-in reward types (rewards/dispatch.py BUILTIN_RMS; register_reward refuses their names) that read a
# sample's text, label, prompt and metadata only, never its token lists: their samples go to the reward worker
# without those. tests/test_rewards.py scores every one of them with and without the token lists. (Kept here, not
# in rewards/: importing that package costs a rollout worker ~0.1 s of start-up it does not otherwise spend.)
TEXT_ONLY_REWARDS = frozenset(("math", "boxed_math", "dapo", "boxed", "exact_match", "exact_match_ci", "f1",
                               "deepscaler", "remote_rm", "random", "code"))
TOKEN_FIELDS = ("prompt_tokens", "response_tokens", "loss_mask", "rollout_log_probs")


def text_only(rm_type: str | None) -> bool:
    """Whether built-in reward type `rm_type` (or boxed_<type>) reads none of a sample's token lists."""
    name = (rm_type or "").strip() if isinstance(rm_type, str) else ""
    return name in TEXT_ONLY_REWARDS or (name.startswith("boxed_") and name[len("boxed_"):] in TEXT_ONLY_REWARDS)


def _text_only_graders(cfg) -> dict[str | None, bool]:
    """Per grader -- "" the job's reward, else an evaluation set's own (--eval-config) -- whether it reads a sample's
    text, label, prompt and metadata only: a built-in reward type (`text_only`), not the user's
    function (--custom-rm-path) or reward actor (--reward-actor-class). A row's own "rm_type" is checked per sample."""
    from ..eval_config import own_graders
    reward = cfg.reward
    out: dict[str | None, bool] = {
        "": not reward.custom_rm_path and not reward.reward_actor_class and text_only(reward.rm_type)}
    for name, s in own_graders(cfg).items():
        out[name] = not s.custom_rm_path and text_only(s.rm_type)
    return out


def _timed(name: str, fn, *args):
    """fn(*args) as a phase of this process's start-up (slime_actors/startup_timeline.py)."""
    from .. import startup_timeline as timeline
    with timeline.phase(name):
        return fn(*args)
