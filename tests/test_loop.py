"""The schedules of slime_actors/actors/controller/loop.py, run against a fake of every other actor (no
processes): the messages the controller sends for each step, in order -- what the wire and the traces of a run
show."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from slime_actors.actors.controller import Controller, loop
from slime_actors.config import parse_config

FLAGS = ["--hf-checkpoint", "tiny:digits", "--input-key", "input", "--label-key", "label",
         "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--global-batch-size", "16",
         "--micro-batch-size", "16", "--num-rollout", "3", "--actor-num-gpus-per-node", "2",
         "--rm-type", "exact_match", "--use-tensorboard", "false", "--progress", "false", "--no-rolling-save"]


def _stats(rollout_id, kind="train"):
    return {"complete": True, "rollout_id": rollout_id, "kind": kind, "groups": 4, "target": 4, "samples": 16,
            "filtered": 0, "failed": 0, "reward_mean": 0.25, "examples": None, "seconds": 0.1,
            **({"batch_id": f"b{rollout_id}"} if kind == "train" else {})}


# the other asks' replies, as the actors answer them (their declared types: a reply lacking a key is a ReplyError)
ACCOUNTING = {"issued": 0, "trained_once": 0, "trained_more": 0, "untrained": 0, "duplicated": [], "trained_rollouts": [],
              "pending_groups": [], "stats": {}, "expected_trained": 0, "lost": 0, "lost_samples": [],
              "untrained_by_state": {}, "discarded": {}, "rollbacks": [], "epoch": 0}
REPLIES = {"start_rollout": lambda b: {"groups": 4, "rollout_id": b["rollout_id"], "kind": b.get("kind", "train")},
           "rollback": lambda b: {"rolled_back": False, "reason": "not ahead"},
           "pause": lambda b: {"in_flight": 0, "mode": None},
           "end_rollout": lambda b: {"aborted": 0, "returned": 0},
           "accounting": lambda b: dict(ACCOUNTING),
           "eval_results": lambda b: [],
           "dump_rollout": lambda b: [{"index": 0, "prompt": "1+1", "response": "2", "reward": 1.0}]}


def _controller(tmp_path, *flags, stats=_stats, base=FLAGS) -> Controller:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"input": "1+1", "label": "2"}\n')
    ctl = Controller(0, args=parse_config(base + ["--prompt-data", str(prompts), *flags]).to_dict())
    ctl.runtime = SimpleNamespace(run_dir=str(tmp_path / "run"), down_after=1.0)
    ctl.sent = []

    async def ask(to, method, body=None, *, timeout=None):
        ctl.sent.append((to, method, body))
        await asyncio.sleep(0)
        if method == "wait_rollout":
            st = stats(body["rollout_id"], body.get("kind", "train"))
            return {k: v for k, v in st.items() if k != "hack" or body.get("hack") is not False}
        if method == "hack_report":
            return stats(body["rollout_id"]).get("hack")
        if method == "train":
            return {"loss": 0.5}
        if method == "sync_weights":
            return {"bytes": 10}
        reply = REPLIES.get(method)
        return reply(body or {}) if reply else None

    async def tell(to, method, body=None):
        ctl.sent.append((to, method, body))

    ctl.ask, ctl.tell = ask, tell
    ctl.engines.versions = {"rollout/0": 0}
    asyncio.run(ctl.metrics.open(resume_at=None))
    return ctl


def _step(k: int, v: int, last: bool = False) -> list[tuple]:
    # rollout k+1 made while the trainers train on k (once the engines ended k), held until step k+1 starts it
    ahead = [] if last else [("buffer/0", "start_rollout", {"rollout_id": k + 1, "weight_version": v + 1,
                                                            "hold": True}),
                             ("rollout/0", "take_ahead", {"rollout_id": k + 1})]   # (its share leased now)
    return [("buffer/0", "start_rollout", {"rollout_id": k, "weight_version": v}),
            ("rollout/0", "resume", {"weight_version": v}),
            ("buffer/0", "wait_rollout", {"rollout_id": k, "timeout": 86400.0, "hack": False}),
            # (each rank trains on the batch wait_rollout named: the one it fetched ahead, when it is that one)
            ("trainer/0", "train", {"rollout_id": k, "batch_id": f"b{k}"}),
            ("trainer/1", "train", {"rollout_id": k, "batch_id": f"b{k}"}),
            ("buffer/0", "hack_report", {"rollout_id": k}),   # (answered while the trainers train)
            ("rollout/0", "end_rollout", {"rollout_id": k}),
            *ahead,
            ("buffer/0", "mark_trained", {"rollout_id": k})] + [
            (f"trainer/{r}", "sync_weights", {"weight_version": v + 1, "workers": ["rollout/0"], "rebuild": False})
            for r in (0, 1)]


def test_without_save_the_rolling_checkpoint_is_saved_after_the_last_step(tmp_path):
    """No --save (and rolling left on): after the last rollout every trainer rank and the buffer save into
    RUN_DIR/ckpt/iter_0000003, which the controller commits."""
    ctl = _controller(tmp_path, base=[f for f in FLAGS if f != "--no-rolling-save"])
    asyncio.run(loop.train_sync(ctl, 0))
    path = str(tmp_path / "run" / "ckpt" / "iter_0000003")
    saves = [(to, m, b) for to, m, b in ctl.sent if m == "save"]
    assert sorted(saves) == sorted([(f"trainer/{r}", "save", {"path": path, "save_optim": True}) for r in (0, 1)]
                                   + [("buffer/0", "save", {"path": path})]), saves
    assert (tmp_path / "run" / "ckpt" / "iter_0000003" / "meta.json").exists()
    assert str(ctl.checkpoints.latest) == path


def test_a_steps_row_is_written_once_the_next_steps_first_asks_are_out(tmp_path):
    """The row of step k goes to metrics.jsonl (and TensorBoard, the console) after step k+1's start_rollout and
    resume are sent, not between the two steps; every row is there, in order, when the job ends."""
    ctl = _controller(tmp_path)
    write = ctl.metrics._write

    def written(step):
        ctl.sent.append(("row", step["rollout_id"]))
        write(step)
    ctl.metrics._write = written
    asyncio.run(loop.train_sync(ctl, 0))
    # (here the weight version a step resumes the engines at is its rollout id)
    order = [(m[0], m[1]) if m[0] == "row" else (m[1], m[2].get("rollout_id", m[2].get("weight_version")))
             for m in ctl.sent if m[0] == "row" or m[1] in ("start_rollout", "resume") and not m[2].get("hold")]
    assert order == [("start_rollout", 0), ("resume", 0), ("start_rollout", 1), ("resume", 1), ("row", 0),
                     ("start_rollout", 2), ("resume", 2), ("row", 1), ("row", 2)]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [0, 1, 2]


def test_a_row_not_written_yet_is_written_when_the_metrics_close(tmp_path):
    """A row recorded just before the job ends (or fails) is not lost: `flush` (the metrics' finish, a failed
    loop, a hack-alarm stop, a training-group restart) writes it."""
    ctl = _controller(tmp_path)
    path = tmp_path / "run" / "metrics.jsonl"

    async def go():
        ctl.metrics.record(ctl.begin_step(0))
        before = path.read_text()
        ctl.metrics.flush()
        return before, path.read_text()
    before, after = asyncio.run(go())
    assert before == "" and json.loads(after)["rollout_id"] == 0


def test_the_synchronous_schedule_sends_each_step_in_order(tmp_path):
    ctl = _controller(tmp_path)
    asyncio.run(loop.train_sync(ctl, 0))
    assert ctl.sent == _step(0, 0) + _step(1, 1) + _step(2, 2, last=True)
    assert ctl.version == 3 and [h["rollout_id"] for h in ctl.metrics.history] == [0, 1, 2]
    row = ctl.metrics.history[0]
    assert row["rollout/reward_mean"] == 0.25 and row["train/loss"] == 0.5 and row["weight_sync/bytes"] == 10
    assert row["weight_version"] == 0 and row["weight_version_after"] == 1


def test_a_step_overlaps_the_asks_that_do_not_wait_on_each_other(tmp_path):
    """The buffer opens a rollout (or makes its groups) while the engines resume; the engines end the rollout while
    the trainers train, and the buffer makes the next rollout's groups (held) then too; the buffer frees the rollout
    during the weight sync. Each of these replies here only once the other message of its pair went out: a schedule
    that awaited them one after the other would never finish."""
    ctl = _controller(tmp_path)
    pairs = {"start_rollout": "resume", "end_rollout": "train", "mark_trained": "sync_weights"}
    ask, tell = ctl.ask, ctl.tell
    seen: dict[str, asyncio.Event] = {}

    def event(method):
        return seen.setdefault(method, asyncio.Event())

    async def paired_ask(to, method, body=None, *, timeout=None):
        held = bool((body or {}).get("hold"))
        event(method + "/hold" * held).set()
        # a trainer (rank 1, the last asked) answers only once rollout k+1 is being made (not after the last one)
        other = "start_rollout/hold" if method == "train" and to == "trainer/1" and body["rollout_id"] < 2 else \
            None if held else pairs.get(method)
        if other:
            await event(other).wait()
            event(other).clear()
        return await ask(to, method, body, timeout=timeout)

    async def paired_tell(to, method, body=None):
        event(method).set()
        await tell(to, method, body)

    ctl.ask, ctl.tell = paired_ask, paired_tell

    async def go():
        await asyncio.wait_for(loop.train_sync(ctl, 0), 10)

    asyncio.run(go())
    assert ctl.version == 3 and [h["rollout_id"] for h in ctl.metrics.history] == [0, 1, 2]


def test_the_asynchronous_schedule_generates_the_next_rollout_while_training(tmp_path):
    ctl = _controller(tmp_path, "--async-train")
    asyncio.run(loop.train_async(ctl, 0))
    sent = [(to, m, (b or {}).get("rollout_id")) for to, m, b in ctl.sent]
    # rollout k+1 is asked for before the trainers are done with k; rollouts are not ended while one follows
    for k in (0, 1):
        assert sent.index(("buffer/0", "start_rollout", k + 1)) < sent.index(("buffer/0", "mark_trained", k))
        assert ("rollout/0", "end_rollout", k) not in sent
    assert ("rollout/0", "end_rollout", 2) in sent, "the last rollout is ended"
    # the engines pause for each weight update (they generate meanwhile) and resume after it
    syncs = [i for i, s in enumerate(sent) if s[1] == "sync_weights"]
    assert len(syncs) == 6 and all(sent[i - 1][1] == "pause" or sent[i - 1][1] == "sync_weights" for i in syncs)
    assert [h["rollout_id"] for h in ctl.metrics.history] == [0, 1, 2] and ctl.version == 3


def test_debug_rollout_only_marks_rollouts_trained_without_training(tmp_path):
    ctl = _controller(tmp_path, "--debug-rollout-only")
    asyncio.run(loop.train_sync(ctl, 1))
    methods = [m for _, m, _ in ctl.sent]
    assert methods == ["start_rollout", "resume", "wait_rollout", "hack_report", "mark_trained"] * 2
    assert ctl.version == 0


def _alarm_on(tripped_at: int):
    """Rollout stats whose hacking report trips an alarm on rollout `tripped_at`, with pass@k on every rollout."""
    def stats(rollout_id, kind="train"):
        st = {**_stats(rollout_id, kind), "passrate": {"pass@1": 0.25, "pass@4": 0.5}}
        if kind == "train":
            alarms = [{"name": "length_spike", "metric": "hack/len", "value": 9.0, "threshold": 3.0,
                       "message": "responses grew"}] if rollout_id == tripped_at else []
            st["hack"] = {"rollout_id": rollout_id, "metrics": {"hack/len": 1.0}, "alarms": alarms, "skipped": {}}
        return st
    return stats


def test_hack_alarms_stop_ends_the_run_after_that_step_with_a_checkpoint(tmp_path):
    from slime_actors.monitor.alarms import read_alarms
    for schedule, flags in ((loop.train_sync, ()), (loop.train_async, ("--async-train",))):
        run = tmp_path / schedule.__name__
        run.mkdir()
        ctl = _controller(run, "--num-rollout", "5", "--hack-alarms", "stop", "--save", str(run / "ckpt"),
                          "--save-interval", "100", *flags, stats=_alarm_on(1))
        asyncio.run(loop.train_sync(ctl, 0) if schedule is loop.train_sync else loop.train_async(ctl, 0))
        rows = ctl.metrics.history
        assert [h["rollout_id"] for h in rows] == [0, 1], schedule.__name__
        assert rows[0]["hack/len"] == 1.0 and rows[0]["passrate/pass@4"] == 0.5
        # a checkpoint after the stopping step (--save-interval 100 alone would save none)
        saves = [b["path"] for to, m, b in ctl.sent if m == "save" and to == "buffer/0"]
        assert saves == [str(run / "ckpt" / "iter_0000002")], schedule.__name__
        assert (run / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "2"
        assert ctl.metrics.stopped["rollout_id"] == 1 and ctl.metrics.stopped["steps_left"] == 3
        assert ctl.metrics.stopped["checkpoint"] == saves[0] and "length_spike" in ctl.metrics.stopped["reason"]
        assert ctl.metrics.end == 2 and ctl.status()["stopped"] == ctl.metrics.stopped
        assert [a["rollout_id"] for a in read_alarms(ctl.runtime.run_dir)] == [1]
        result = asyncio.run(ctl.metrics.finish(accounting=None))
        assert result["status"] == "stopped" and result["stopped"] == ctl.metrics.stopped


def test_hack_alarms_warn_goes_on_and_the_result_is_done(tmp_path):
    ctl = _controller(tmp_path, "--hack-alarms", "warn", stats=_alarm_on(0))
    asyncio.run(loop.train_sync(ctl, 0))
    assert [h["rollout_id"] for h in ctl.metrics.history] == [0, 1, 2] and ctl.metrics.stopped is None
    assert asyncio.run(ctl.metrics.finish(accounting=None))["status"] == "done"
    from slime_actors.monitor.alarms import read_alarms
    assert [a["signal"] for a in read_alarms(ctl.runtime.run_dir)] == ["length_spike"]
    assert [h["hack/len"] for h in ctl.metrics.history] == [1.0] * 3
    # a restart from rollout 0 (a training-group recovery) drops the alarms of the rollouts done again
    ctl.metrics.drop_from(0)
    assert read_alarms(ctl.runtime.run_dir) == []


def test_an_evaluation_reports_pass_at_k_per_set(tmp_path):
    prompts = tmp_path / "eval.jsonl"
    prompts.write_text('{"input": "1+1", "label": "2"}\n')
    ctl = _controller(tmp_path, "--eval-prompt-data", "digits", str(prompts), stats=_alarm_on(-1))
    out = asyncio.run(ctl.evaluations.run(0))
    assert out == {"digits": 0.25, "digits-pass@1": 0.25, "digits-pass@4": 0.5}



def test_no_rollout_is_made_ahead_of_an_evaluation(tmp_path):
    """An evaluation after step k starts (and numbers its groups) before rollout k+1 is made, as it always did: the
    samples' numbers -- and with them their sampling seeds -- are those of a run that makes nothing ahead."""
    prompts = tmp_path / "eval.jsonl"
    prompts.write_text('{"input": "1+1", "label": "2"}\n')
    ctl = _controller(tmp_path, "--eval-prompt-data", "digits", str(prompts), "--eval-interval", "2",
                      "--num-rollout", "4")
    asyncio.run(loop.train_sync(ctl, 0))
    starts = [(b["rollout_id"], b.get("kind", "train"), bool(b.get("hold"))) for _to, m, b in ctl.sent
              if m == "start_rollout"]
    assert starts == [(0, "train", False), (1, "train", True), (1, "train", False), (2000, "eval", False),
                      (2, "train", False), (3, "train", True), (3, "train", False), (4001, "eval", False)], starts


def test_no_rollout_is_made_ahead_of_a_checkpoint(tmp_path):
    """A checkpoint saved after step k holds no rollout made ahead (nor its groups leased to the workers of a job
    that a resumed one would not have): a job resumed from it goes on as the one that saved it."""
    ctl = _controller(tmp_path, "--save", str(tmp_path / "ckpt"), "--save-interval", "2", "--num-rollout", "4")
    asyncio.run(loop.train_sync(ctl, 0))
    held = [b["rollout_id"] for _to, m, b in ctl.sent if m == "start_rollout" and b.get("hold")]
    saves = sorted({b["path"].rsplit("_", 1)[1] for _to, m, b in ctl.sent if m == "save"})
    assert held == [1, 3] and saves == ["0000002", "0000004"], (held, saves)


def test_save_without_save_interval_saves_after_the_last_rollout(tmp_path):
    """`--save DIR` alone (slime saves nothing then) keeps the trained model: one checkpoint, after the last rollout.
    --no-rolling-save without --save keeps none."""
    def saved(*flags):
        run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        run.mkdir()
        ctl = _controller(run, "--num-rollout", "3", *flags)
        asyncio.run(loop.train_sync(ctl, 0))
        return sorted(b["path"].replace(str(tmp_path), "") for to, m, b in ctl.sent if m == "save" and to == "buffer/0")
    assert saved("--save", str(tmp_path / "ck")) == ["/ck/iter_0000003"]
    assert saved("--save", str(tmp_path / "ck2"), "--save-interval", "2") == ["/ck2/iter_0000002", "/ck2/iter_0000003"]
    assert saved("--no-rolling-save") == []


def _holding(ctl, held=("hack_report", "dump_rollout")):
    """The controller's asks, the replies to `held` for rollout k kept until the trainers have been asked to train
    on k. A loop that waited for one of them before asking would wait for ever: the test times out and fails."""
    ask, trains = ctl.ask, {}

    async def holding(to, method, body=None, *, timeout=None):
        if method in held:
            ctl.sent.append((to, method, body))
            await asyncio.sleep(0)
            k = body["rollout_id"]
            await asyncio.wait_for(trains.setdefault(k, asyncio.Event()).wait(), 30)
            if method == "dump_rollout":
                return [{"index": k, "prompt": "1+1", "response": "2", "reward": 1.0}]
            return {"rollout_id": k, "metrics": {"hack/len": 1.0}, "alarms": [], "skipped": {}}
        if method == "train":
            trains.setdefault(body["rollout_id"], asyncio.Event()).set()
        return await ask(to, method, body, timeout=timeout)
    ctl.ask = holding


def test_training_is_asked_before_the_hack_report_and_the_debug_data_come_back(tmp_path):
    """Issue 33: the buffer's hack report and --save-debug-rollout-data's dump no longer hold up the step -- the
    trainers are asked without waiting for them; the step's row and the file have them all the same, before
    mark_trained."""
    import msgpack

    from slime_actors.config import debug_rollout_path
    for schedule, flags in ((loop.train_sync, ()), (loop.train_async, ("--async-train",))):
        run = tmp_path / schedule.__name__
        run.mkdir()
        ctl = _controller(run, "--save-debug-rollout-data", str(run / "rollouts"), *flags)
        _holding(ctl)
        asyncio.run(asyncio.wait_for(schedule(ctl, 0), 60))
        sent = [(m, (b or {}).get("rollout_id")) for _, m, b in ctl.sent]
        for k in range(3):
            # the synchronous schedule asks the trainers before anything else; the asynchronous one once the next
            # rollout is started, after the reports
            order = ["train", "hack_report", "dump_rollout"] if schedule is loop.train_sync else \
                ["hack_report", "dump_rollout", "train"]
            at = [sent.index((m, k)) for m in order + ["mark_trained"]]
            assert at == sorted(at), (schedule.__name__, sent)
            path = debug_rollout_path(str(run / "rollouts"), k)
            assert msgpack.unpackb(path.read_bytes())["samples"][0]["index"] == k
        # the report's metrics are in the row where they always were: after the rollout's, before time/train
        for row in ctl.metrics.history:
            keys = list(row)
            assert row["hack/len"] == 1.0
            assert keys.index("time/rollout") < keys.index("hack/len") < keys.index("time/train"), keys
        assert [h["rollout_id"] for h in ctl.metrics.history] == [0, 1, 2]


def test_a_debug_data_file_that_cannot_be_written_still_fails_the_job(tmp_path):
    """The dump runs while the trainers train, but a failed one fails the step before the buffer frees the
    rollout, as when it ran first."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    for schedule, flags in ((loop.train_sync, ()), (loop.train_async, ("--async-train",))):
        run = tmp_path / schedule.__name__
        run.mkdir()
        ctl = _controller(run, "--save-debug-rollout-data", str(blocker / "rollouts"), *flags)
        try:
            asyncio.run(schedule(ctl, 0))
        except OSError as exc:
            assert "not-a-dir" in str(exc)
        else:
            raise AssertionError("the job went on without its debug data")
        methods = [m for _, m, _ in ctl.sent]
        assert "dump_rollout" in methods and "mark_trained" not in methods and ctl.metrics.history == []


def test_a_failed_weight_sync_fails_the_step_and_the_rollout_is_still_marked_trained(tmp_path, caplog):
    """mark_trained goes out with the weight sync: when the sync fails, its error is the step's, the buffer has
    still been told (it was trained on), and the mark's own failure is not left for asyncio to report as never
    retrieved."""
    import gc
    import logging
    ctl = _controller(tmp_path)
    ask = ctl.ask

    async def failing(to, method, body=None, *, timeout=None):
        if method == "sync_weights":
            ctl.sent.append((to, method, body))
            raise RuntimeError("the engine refused the weights")
        if method == "mark_trained":
            ctl.sent.append((to, method, body))
            await asyncio.sleep(0.05)          # answered after the sync failed, with an error of its own
            raise RuntimeError("the buffer restarted")
        return await ask(to, method, body, timeout=timeout)
    ctl.ask = failing

    async def go():
        try:
            await loop.train_sync(ctl, 0)
        finally:
            await asyncio.sleep(0.1)           # (the mark's reply comes in)
    messages = []
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        try:
            asyncio.run(go())
        except Exception as exc:  # noqa: BLE001
            messages.append(repr(exc) + repr(exc.__cause__))
        del ctl.ask
        gc.collect()                           # (an unretrieved error is reported when its task is collected)
    assert messages and "the engine refused the weights" in messages[0], messages
    assert ("buffer/0", "mark_trained", {"rollout_id": 0}) in ctl.sent and ctl.metrics.history == []
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()], caplog.text


def test_the_job_waits_for_the_buffer_to_serve_before_its_first_ask(tmp_path):
    """Every actor is listed once its process runs; the buffer serves only once its start (loading the prompts) has
    finished. The controller pings it after the listing and before the rollback at the job's start -- whose
    attempts wait 10 s each -- so a buffer still loading is waited for, not asked again and warned about."""
    ctl = _controller(tmp_path)
    fake_ask = ctl.ask
    served = asyncio.Event()

    async def ask(to, method, body=None, *, timeout=None):
        if method == "list":
            ctl.sent.append((to, method, body))
            return {n: {"alive": True, "endpoint": "e", "host": "h", "last_seen": 0.0, "pid": 1}
                    for n in ["buffer/0", "trainer/0", "trainer/1", "rollout/0", "reward/0"]}
        if method == "_ping":
            ctl.sent.append((to, method, body))
            await served.wait()     # the buffer still loads its prompts
            return {"name": to, "role": "buffer", "index": 0, "pid": 1, "host": "h", "uptime": 20.0}
        return await fake_ask(to, method, body, timeout=timeout)
    ctl.ask = ask

    async def run():
        waiting = asyncio.ensure_future(ctl.wait_for_actors(timeout=60))
        await asyncio.sleep(0.05)
        assert not waiting.done() and [m for _, m, _ in ctl.sent] == ["list", "_ping"]
        served.set()
        await asyncio.wait_for(waiting, 5)
    asyncio.run(run())
    assert ctl.sent[-1][:2] == ("buffer/0", "_ping")


def test_a_row_that_cannot_be_written_is_said_and_the_job_goes_on(tmp_path):
    """The row is written by a callback of the event loop: a write that fails (a full disk) is logged as an error
    naming the metrics, not raised into asyncio's handler, and the steps go on."""
    from structlog.testing import capture_logs
    ctl = _controller(tmp_path)

    def full(step):
        raise OSError(28, "No space left on device")
    ctl.metrics._write = full
    with capture_logs() as logs:
        asyncio.run(loop.train_sync(ctl, 0))
    assert [h["rollout_id"] for h in ctl.metrics.history] == [0, 1, 2]
    errors = [e for e in logs if e["log_level"] == "error"]
    assert errors and all(e["event"] == "could not write a step's row to the run's metrics" for e in errors)
    assert "No space left on device" in errors[0]["error"]
