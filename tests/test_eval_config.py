"""A held-out set graded by a reward of its own (--eval-config, slime's format): the file is read and checked before
any process starts, every problem at once; the set's samples are marked by the buffer and graded with the set's
reward by the reward role -- also when the training reward is a custom one or an actor of your own -- and the
summary says which reward graded each number."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from helpers import job_config

from slime_actors.actors.base import handler
from slime_actors.actors.reward import RewardActor, RewardWorker
from slime_actors.buffer_state import BufferSettings, BufferState
from slime_actors.config import ConfigError
from slime_actors.data import EvalDatasets, PromptDataset
from slime_actors.eval_config import EVAL_SET_KEY, EvalSet, eval_sets, grader_name, read_eval_config
from slime_actors.launch.job_config import build_job_config
from slime_actors.launch.summary import print_summary
from slime_actors.types import Sample

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"

PAYS_ALL = "def reward(args, sample):\n    return 1.0   # built to be hacked: pays for anything\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def prompts(tmp_path: Path, name: str, rows: list[tuple[str, str]], key="label") -> Path:
    return write(tmp_path, name, "".join(json.dumps({"input": q, key: a}) + "\n" for q, a in rows))


def head(*flags):
    """The job's config as the head builds it (every check before a process starts)."""
    return build_job_config(["--prompt-data", str(DIGITS / "train.jsonl"), "--hf-checkpoint", "tiny:digits",
                             *flags])[0]


# ------------------------------------------------------------------------------------------------ the file
def test_slimes_format_list_or_table_with_defaults_and_paths_next_to_the_file(tmp_path):
    prompts(tmp_path, "a.jsonl", [("1 2 3 first =", "1")])
    prompts(tmp_path, "b.jsonl", [("4 5 6 first =", "4")], key="answer")
    write(tmp_path, "graders.py", "def strict(args, sample):\n    return 0.0\n")
    write(tmp_path, "eval.yaml", """\
eval:
  defaults:
    label_key: label
    temperature: 0.0
  datasets:
    - name: a
      path: a.jsonl
      rm_type: exact_match
    - name: b
      path: b.jsonl
      label_key: answer
      custom_rm_path: graders.py:strict
""")
    sets, sampling, problems = read_eval_config(str(tmp_path / "eval.yaml"))
    assert problems == [] and sampling == {"temperature": 0.0}
    assert sets == [EvalSet("a", str(tmp_path / "a.jsonl"), rm_type="exact_match", label_key="label"),
                    EvalSet("b", str(tmp_path / "b.jsonl"), custom_rm_path=f"{tmp_path / 'graders.py'}:strict",
                            label_key="answer")]
    # the same as a table keyed by name, in JSON (YAML reads it) and in TOML
    write(tmp_path, "eval.json", json.dumps({"eval": {"datasets": {"a": {"path": "a.jsonl", "rm_type": "math"}}}}))
    write(tmp_path, "eval.toml", '[eval.datasets.a]\npath = "a.jsonl"\nrm_type = "math"\n')
    for f in ("eval.json", "eval.toml"):
        assert read_eval_config(str(tmp_path / f))[0] == [EvalSet("a", str(tmp_path / "a.jsonl"), rm_type="math")]


def test_the_head_writes_the_sets_and_the_sampling_into_the_flags(tmp_path):
    prompts(tmp_path, "a.jsonl", [("1 2 3 first =", "1")])
    cfg_file = write(tmp_path, "eval.yaml", "eval:\n  defaults: {n_samples_per_eval_prompt: 4, temperature: 0.7}\n"
                                            "  datasets:\n    - {name: a, path: a.jsonl, rm_type: exact_match}\n")
    cfg = head("--rm-type", "math", "--eval-config", str(cfg_file), "--eval-prompt-data", "x", str(DIGITS /
                                                                                                   "heldout.jsonl"))
    assert cfg.eval.eval_prompt_data == ["a", str(tmp_path / "a.jsonl")]
    assert (cfg.eval.n_samples_per_eval_prompt, cfg.eval.eval_temperature) == (4, 0.7)
    assert any(n.startswith("--eval-prompt-data is ignored: --eval-config") for n in cfg.notes)
    assert [s.name for s in eval_sets(cfg)] == ["a"]
    # the job's config travels as a table (job.json, every actor) and reads the same sets back
    from slime_actors.config import JobConfig
    again = JobConfig.from_dict(cfg.to_dict())
    assert eval_sets(again) == eval_sets(cfg)


def test_every_problem_of_the_file_is_named_at_once_before_start(tmp_path):
    prompts(tmp_path, "a.jsonl", [("1 2 3 first =", "1")])
    cfg_file = write(tmp_path, "eval.yaml", """\
eval:
  defaults:
    temperature: -1
  datasets:
    - name: a
      path: a.jsonl
      rm_type: exact_macth
      stop: ["\\n"]
    - name: a
      path: missing.jsonl
      rm_type: math
      custom_rm_path: x.py:f
      colour: red
    - name: ../etc
      path: a.jsonl
    - name: c
      rm_type: remote_rm
    - name: d
      path: a.jsonl
      custom_rm_path: nowhere.py:f
""")
    with pytest.raises(ConfigError) as ei:
        head("--rm-type", "math", "--eval-config", str(cfg_file))
    msg = str(ei.value)
    for needle in ("set 'a': unknown rm_type 'exact_macth'",
                   "set 'a': slime's key 'stop' is not supported here",
                   "two sets are named 'a'",
                   "set 'a': give `rm_type` or `custom_rm_path`, not both",
                   "set 'a': unknown key 'colour'",
                   "`name` must be letters, digits",
                   "set 'c': no `path`",
                   "set 'a': its prompt file missing.jsonl does not exist (neither next to the eval config",
                   "set 'd': custom_rm_path names nowhere.py, which does not exist",
                   "temperature must be a number >= 0, got -1"):
        assert needle in msg, (needle, msg)
    assert msg.count("\n") >= 9                          # one line per problem
    assert f"--eval-config {cfg_file}" in msg


@pytest.mark.parametrize("text,needle", [
    ("eval: [1, 2", ":1: not valid YAML"),
    ("- a\n- b\n", "expected a table"),
    ("eval:\n  datasets: []\n", "`eval.datasets` is empty"),
    ("eval:\n  defaults: {}\n", "no datasets"),
    ("eval:\n  datasets:\n    - {name: a, path: a.jsonl}\n    - {name: b, path: a.jsonl, top_p: 0.5}\n"
     "    - {name: c, path: a.jsonl, top_p: 0.9}\n", "top_p 0.9 differs from the 0.5"),
])
def test_a_file_that_is_not_an_eval_config_is_refused(tmp_path, text, needle):
    prompts(tmp_path, "a.jsonl", [("1 2 3 first =", "1")])
    f = write(tmp_path, "eval.yaml", text)
    with pytest.raises(ConfigError) as ei:
        head("--rm-type", "math", "--eval-config", str(f))
    assert needle in str(ei.value)
    with pytest.raises(ConfigError, match="does not exist"):
        head("--rm-type", "math", "--eval-config", str(tmp_path / "none.yaml"))
    big = write(tmp_path, "big.yaml", "#" * (1 << 20 + 1))
    with pytest.raises(ConfigError, match="an eval config is a few lines"):
        head("--rm-type", "math", "--eval-config", str(big))


def test_each_set_reads_its_own_keys(tmp_path):
    prompts(tmp_path, "a.jsonl", [("1 2 3 first =", "1")])
    prompts(tmp_path, "b.jsonl", [("4 5 6 first =", "4")], key="answer")
    f = write(tmp_path, "eval.yaml", "eval:\n  datasets:\n    - {name: a, path: a.jsonl}\n"
                                     "    - {name: b, path: b.jsonl, label_key: answer}\n")
    cfg = job_config(eval_config=str(f), label_key="label", input_key="input")
    sets = EvalDatasets.from_config(cfg, tokenizer=None)
    assert [(n, [p.label for p in ds.all_prompts()]) for n, ds in sets.items()] == [("a", ["1"]), ("b", ["4"])]


# ------------------------------------------------------------------------------------------------ the buffer
def test_the_buffer_marks_eval_samples_with_their_set_and_unmarks_training_ones(tmp_path):
    # a training row that claims to be of an eval set is not: only the buffer says which set a sample is of
    train = write(tmp_path, "t.jsonl", json.dumps({"input": "1 2 3 first =", "label": "1",
                                                   "metadata": {EVAL_SET_KEY: "heldout", "kept": 1}}) + "\n")
    held = prompts(tmp_path, "h.jsonl", [("4 5 6 first =", "4")])
    st = BufferState(BufferSettings(1, 1, 2), PromptDataset(train, metadata_key="metadata"),
                     {"heldout": PromptDataset(held)})
    st.start_rollout(0)
    st.start_rollout(1000, kind="eval", name="heldout")
    groups = st.take("rollout/0", 10)
    by_kind = {g["kind"]: g["samples"] for g in groups}
    assert [s["metadata"] for s in by_kind["train"]] == [{"kept": 1}] * 2
    assert [s["metadata"] for s in by_kind["eval"]] == [{EVAL_SET_KEY: "heldout"}]


# ------------------------------------------------------------------------------------------------ the reward role
def eval_wire(i, response, label, eval_set=None):
    meta = {EVAL_SET_KEY: eval_set} if eval_set else {}
    return Sample(index=i, group_index=i, prompt="q", response=response, label=label, metadata=meta).to_wire()


def ask_score(actor, samples):
    return asyncio.run(type(actor)._handlers["score"].fn(actor, samples=samples, group=False))


def graded_job(tmp_path, **flags):
    prompts(tmp_path, "h.jsonl", [("4 5 6 first =", "4")])
    f = write(tmp_path, "eval.yaml", "eval:\n  datasets:\n    - {name: heldout, path: h.jsonl, rm_type: exact_match}\n"
                                     "    - {name: same, path: h.jsonl}\n")
    return job_config(eval_config=str(f), **flags)


def test_a_set_with_its_own_reward_is_graded_by_it_whatever_the_training_reward(tmp_path):
    rm = write(tmp_path, "pays_all.py", PAYS_ALL)
    cfg = graded_job(tmp_path, custom_rm_path=f"{rm}:reward", rm_type=None)
    w = RewardWorker(0, args=cfg.to_dict())
    samples = [eval_wire(0, "9", "4", "heldout"), eval_wire(1, "4", "4", "heldout"),
               eval_wire(2, "9", "4", "same"), eval_wire(3, "9", "4")]
    rep = ask_score(w, samples)
    # the held-out set's exact_match says 9 is wrong; the set without a reward of its own, and training, pay all
    assert rep["rewards"] == [0.0, 1.0, 1.0, 1.0] and rep["errors"] == [None] * 4
    assert grader_name(cfg, eval_sets(cfg)[0]) == "exact_match (the set's own)"
    assert grader_name(cfg, eval_sets(cfg)[1]) == f"the training reward (--custom-rm-path {rm}:reward)"


class Lenient(RewardActor):
    """An actor of your own that pays for anything."""

    async def score(self, sample: Sample) -> float:
        self.seen = getattr(self, "seen", 0) + 1
        return 1.0


def test_an_actor_of_your_own_leaves_the_sets_with_their_own_reward_to_it(tmp_path):
    cfg = graded_job(tmp_path, reward_actor_class="x.py:Lenient", rm_type=None)
    a = Lenient(0, args=cfg.to_dict())
    rep = ask_score(a, [eval_wire(0, "9", "4", "heldout"), eval_wire(1, "9", "4")])
    assert rep["rewards"] == [0.0, 1.0] and a.seen == 1
    assert grader_name(cfg, eval_sets(cfg)[1]) == "the training reward (--reward-actor-class x.py:Lenient)"


def test_an_actor_that_answers_the_score_message_itself_is_refused_with_sets_of_their_own(tmp_path):
    class Wire(RewardWorker):
        @handler
        async def score(self, samples: list, group: bool = False) -> dict:
            return {"rewards": [1.0] * len(samples), "errors": [None] * len(samples)}

    with pytest.raises(TypeError, match=r"cannot leave the held-out sets \['heldout'\] to the rewards"):
        Wire(0, args=graded_job(tmp_path).to_dict())
    Wire(0, args=job_config().to_dict())                 # without them it is what it was


def test_a_sets_reward_that_cannot_load_stops_the_reward_worker_at_start(tmp_path):
    prompts(tmp_path, "h.jsonl", [("4 5 6 first =", "4")])
    write(tmp_path, "g.py", "x = 1\n")
    f = write(tmp_path, "eval.yaml", "eval:\n  datasets:\n    - {name: h, path: h.jsonl, custom_rm_path: g.py:nope}\n")
    w = RewardWorker(0, args=job_config(eval_config=str(f)).to_dict())
    from slime_actors.rewards import RewardConfigError
    with pytest.raises(RewardConfigError, match="--eval-config: set 'h': .*nope"):
        asyncio.run(w.on_start())


# ------------------------------------------------------------------------------------------------ the summary
def test_the_summary_says_which_reward_graded_each_number(tmp_path, capsys):
    result = {"steps": 3, "seconds": 1.0, "weight_version": 3, "eval_before": {"heldout": 0.1, "same": 0.5},
              "eval_after": {"heldout": 0.2, "same": 1.0}, "metrics": "m",
              "eval_graders": {"heldout": "exact_match (the set's own)",
                               "same": "the training reward (--custom-rm-path hack.py:reward)"}}
    print_summary(result, tmp_path)
    out = capsys.readouterr().out
    assert ("held-out reward [heldout]: before 0.100 -> after 0.200 (+0.100)   graded by exact_match (the set's own)"
            in out)
    assert "held-out reward [same]: before 0.500 -> after 1.000 (+0.500)   graded by the training reward " \
           "(--custom-rm-path hack.py:reward)" in out
