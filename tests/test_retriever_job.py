"""The retriever as a role of a running job (slime-actors launch, the digits task, a generate function that searches
before it answers): a replica placed by the topology, reached with the job's key through the rollout worker's
recorded client, killed mid-run: its launcher restarts it, the searches in flight wait and are sent again to the
restarted one (at its new port; the worker logs and counts them), the job completes every step exactly
once, and the rollout worker replays identically -- its retrievals are recorded inputs. (Failover between replicas:
tests/test_retriever.py; a search that no replica answers in time fails its episode: tests/test_search_env.py.)"""

from __future__ import annotations

import json
import os
import signal

import pytest

from test_fault_tolerance import BATCH, alive, finish, new_incarnation
from test_launch_support import FAST_FLAGS, ROOT, Job, topology

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="needs Linux /proc")]

# enough steps that the job is still running two steps after the restart: on a fast machine a step of this job takes
# ~0.1 s once the restarted replica answers (with 6 steps, CI's run finished before the test looked again)
STEPS = 20
CORPUS = str(ROOT / "examples" / "search" / "tiny" / "corpus.jsonl")

GENERATE = '''
from slime_actors.types import COMPLETED, TRUNCATED


async def generate(args, sample, sampling_params, engine):
    """Search first (the job's retriever, recorded), then answer with one generation call. Each sample's requests
    are its own (the query and the seed name it): a replay serves recorded answers by request, and concurrent
    requests alike in every field could be served each other's."""
    found = await engine.retrieve([f"zorvik age {sample.index}"], topk=1)
    doc = found["result"][0][0]["document"]
    out = await engine.generate(sample.prompt_tokens, dict(sampling_params, sampling_seed=sample.index))
    sample.response_tokens = list(out["output_ids"])
    sample.loss_mask = [1] * len(out["output_ids"])
    sample.rollout_log_probs = list(out["logprobs"])
    sample.response = engine.tokenizer.decode(sample.response_tokens, skip_special_tokens=True)
    sample.status = TRUNCATED if out["finish_reason"] == "length" else COMPLETED
    sample.metadata = {**sample.metadata, "retrieved": doc["id"]}
    sample.weight_versions = [int(out["weight_version"])]
    sample.weight_version = sample.weight_versions[0]
    return sample
'''

TOPOLOGY = """
[supervisor]
max_restarts = 4
window = 120

[roles.buffer]
[roles.reward]
[roles.rollout]
[roles.trainer]
[roles.retriever]
count = 1
"""


def test_a_killed_retriever_replica_is_restarted_and_the_job_goes_on(tmp_path):
    gen = tmp_path / "search_generate.py"
    gen.write_text(GENERATE)
    job = Job(tmp_path, topology(tmp_path, TOPOLOGY),
              [*FAST_FLAGS, "--num-rollout", str(STEPS), "--retriever-corpus", CORPUS,
               "--custom-generate-function-path", f"{gen}:generate"]).start()
    try:
        job.wait_step(2, phase="rollout", timeout=180)
        before = job.ask("retriever/0", "address")
        assert before["docs"] == 128 and before["url"].startswith("http://127.0.0.1:")
        pid = job.pid("retriever/0")
        at_kill = job.controller()["steps"]     # counted before the kill: the steps after it run fast
        os.kill(pid, signal.SIGKILL)
        new_incarnation(job, "retriever/0", pid)
        job.wait_for(lambda: not alive(pid), 30, "the killed replica to be gone")
        job.wait_step(at_kill + 2, timeout=180)
        after = job.ask("retriever/0", "address")
        assert after["url"] != before["url"]          # a new process, a new port: callers asked again
        # (every sample searches, and the rollout of step at_kill + 2 began after the restart: the new one served)
        assert after["requests"] > 0, after
        # the searches that met the dead replica were sent again: the worker's first try went to the old port
        # (refused), the next to the restarted one. (Its count, retriever_retries, is in the worker's _stats; asking
        # it here would be a message the replay below must answer alike, and a mailbox's counts are not.)
        log = (job.run_dir / "logs" / "rollout-0.jsonl").read_text().splitlines()
        events = [json.loads(x).get("event") for x in log if x.startswith("{")]
        assert "retrieval failed; trying again" in events
        res = finish(job, STEPS, timeout=240)
        assert res["steps"] == STEPS
        # the key file exists and is private; an unkeyed request to a replica is refused
        key = job.run_dir / "keys" / "retriever.key"
        assert key.stat().st_mode & 0o077 == 0
    finally:
        job.close()
    # the rollout worker's recording holds its retrievals and replays identically
    from slime_actors.traces.replay import replay
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        rep = replay(str(job.run_dir), "rollout/0")
        assert rep.identical, rep.render()
    finally:
        os.chdir(cwd)
    trace = b"".join(p.read_bytes() for p in (job.run_dir / "traces").glob("rollout-0.*"))
    assert b"retriever.retrieve" in trace
    assert BATCH == 32
