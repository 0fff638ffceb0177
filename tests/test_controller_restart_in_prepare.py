"""The training group fails while the job prepares (a trainer declared down under load, before the metrics were
opened): the restarted schedule still records its steps. (Found by tests/test_fault_tolerance.py on a loaded
machine: `training loop failed: 'NoneType' object has no attribute 'write'`.)"""

import asyncio
import json
from types import SimpleNamespace

from slime_actors.actors.controller import loop
from slime_actors.actors.controller.metrics import Metrics
from slime_actors.config import JobConfig


class GroupFailedInPrepare:
    """supervise: the first attempt fails inside prepare; the group restarts and the job resumes at rollout 0."""

    def __init__(self):
        self.rejoined = []

    async def supervise(self, job):
        try:
            await job(None)
        except RuntimeError:
            await job(0)

    async def rejoin(self, resume_at):
        self.rejoined.append(resume_at)
        return resume_at


def test_a_group_restarted_while_the_job_prepared_still_records_its_steps(tmp_path, monkeypatch):
    cfg = JobConfig.from_dict({"num_rollout": 2, "use_tensorboard": False, "progress": False, "rm_type": "exact_match",
                               "prompt_data": "p.jsonl", "hf_checkpoint": "tiny:digits"})

    async def run_blocking(fn, *a):
        return fn(*a)

    log = SimpleNamespace(info=lambda *a, **k: None, warning=lambda *a, **k: None)
    ctl = SimpleNamespace(cfg=cfg, runtime=SimpleNamespace(run_dir=str(tmp_path)), run_blocking=run_blocking, log=log,
                          group=GroupFailedInPrepare(), checkpoints=SimpleNamespace(latest=None),
                          evaluations=SimpleNamespace(final_due=lambda start, end: False, history=[]))
    ctl.metrics = Metrics(ctl)

    async def accounting():
        return {}
    ctl.buffer = SimpleNamespace(accounting=accounting)

    async def prepare(c):   # the trainer is declared down before prepare reached metrics.open
        raise RuntimeError("trainer/0 is down (missed heartbeats)")

    async def schedule(c, start):
        for k in range(start, 2):
            c.metrics.record(c.metrics.begin(k, k))
    monkeypatch.setattr(loop, "prepare", prepare)
    monkeypatch.setattr(loop, "train_sync", schedule)
    monkeypatch.setattr(Metrics, "finish", lambda self, accounting: asyncio.sleep(0))
    asyncio.run(loop.run(ctl))
    assert ctl.group.rejoined == [0]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [0, 1]


def test_a_controller_stopped_while_the_job_prepares_leaves_no_unretrieved_error():
    """CI: an actor could not start, the launcher stopped the job, and after the job's `cause:` line asyncio printed
    "Task exception was never retrieved" for the job, whose ask failed when the controller's mailbox closed: the
    controller cancelled `supervise` but not the job it had started. The job stops with it, its error retrieved."""
    from slime_actors.actors.controller.training_group import TrainingGroup
    from tests.unretrieved import settled, watch

    async def main():
        loop_ = asyncio.get_running_loop()
        unretrieved = watch()
        group = TrainingGroup(SimpleNamespace(trainers=[object()]))
        group.start()
        asked = loop_.create_future()   # the job's ask (the directory's listing), answered when the mailbox closes
        state = {}

        async def job(resume_at):
            state["started"] = True
            try:
                await asked
            except asyncio.CancelledError:
                state["cancelled"] = True
                raise

        supervising = asyncio.ensure_future(group.supervise(job))
        while "started" not in state:
            await asyncio.sleep(0)
        supervising.cancel()            # the actor stops: its tasks are cancelled, then its mailbox closes
        asked.set_exception(RuntimeError("controller/0 closed while waiting for directory/0.list"))
        try:
            await supervising
        except asyncio.CancelledError:
            pass
        await settled()
        return state, unretrieved

    state, unretrieved = asyncio.run(main())
    assert unretrieved == [], unretrieved
    assert state.get("cancelled"), "the job kept running after the controller stopped"
