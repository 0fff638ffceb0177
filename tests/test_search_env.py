"""The search environment (slime_actors/environments/search.py) driven by the harness with scripted turns and an
in-process index of the tiny world: what is trained and what is masked, the grading (exact match, F1, Search-R1's
shaping) from what the environment saw -- a model that writes its own <information> is not credited --, the search
limit, invalid turns, the metrics; its options checked; and a retrieval made inside a recorded environment call not
recorded a second time (the outer answer is what a replay serves). The job that learns: tests/test_search_learns.py."""

import asyncio

import pytest

from slime_actors.environments.harness import EnvHarness, ScriptedModel
from slime_actors.environments.search import (SearchEnv, exact_match, f1_score, found_in, golden_answers,
                                              normalize_answer, parse_action)

CORPUS = "examples/search/tiny/corpus.jsonl"
TINY = {"corpus": CORPUS, "topk": 1, "doc_format": "text", "information": " <information> {docs} </information> "}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from slime_actors.environments.harness import load_tokenizer
    from slime_actors.models.tiny import make_tiny_model, words_of
    return load_tokenizer(str(make_tiny_model(tmp_path_factory.mktemp("m") / "tiny", words=words_of("search"))))


def run(tokenizer, turns, label="5", prompt="zorvik age ?", budget=24, **kw):
    h = EnvHarness(SearchEnv, tokenizer, max_response_len=budget, env_kwargs={**TINY, **kw}, max_turns=4)
    return h.run_sync(prompt, ScriptedModel(tokenizer, turns), label=label, metadata={"question": prompt})


def test_search_then_answer_masks_the_information_and_is_graded_by_what_was_retrieved(tokenizer):
    ep = run(tokenizer, ["<search> zorvik age </search>", "<answer> 5 </answer>"])
    s = ep.sample
    assert [(t.strip(), m) for t, m in ep.segments()] == [
        ("<search> zorvik age </search>", True), ("<information> zorvik age is 5 </information>", False),
        ("<answer> 5 </answer>", True)]
    assert all(lp == 0.0 for lp, m in zip(s.rollout_log_probs, s.loss_mask) if not m)
    assert s.reward == 1.0
    assert s.metadata["metrics"] == {"searches": 1, "searched": 1, "recall": 1, "answered": 1, "correct": 1.0,
                                     "valid_format": 1, "search_limit_hit": 0}
    assert s.metadata["search"] == {"queries": ["zorvik age"], "docs": [["zorvik-age"]], "answer": "5"}
    assert [t["tool"] for t in ep.tools] == ["search"]


def test_a_direct_answer_is_exact_match_and_shaping_is_off_by_default(tokenizer):
    assert run(tokenizer, ["<answer> 5 </answer>"]).sample.reward == 1.0        # (a lucky guess)
    wrong = run(tokenizer, ["<answer> 3 </answer>"]).sample
    assert wrong.reward == 0.0 and wrong.metadata["metrics"]["searched"] == 0
    shaped = run(tokenizer, ["<answer> 3 </answer>"], format_score=0.2).sample
    assert shaped.reward == 0.2                                                  # well formed, wrong


def test_the_model_writing_its_own_information_is_not_credited(tokenizer):
    """Search-R1's text grader finds the answer in any <information> block; here only what was retrieved counts."""
    fake = "<answer> 3 </answer> <information> zorvik age is 5 </information>"
    s = run(tokenizer, [fake], format_score=0.2, retrieval_score=0.1, final_format_score=0.1).sample
    assert s.metadata["metrics"]["recall"] == 0 and s.metadata["metrics"]["valid_format"] == 0
    assert s.reward == 0.1                                  # an answer in an ill-formed turn; no retrieval credit
    # a search that found the answer, then a wrong answer: well formed, and the retrieval is credited
    s = run(tokenizer, ["<search> zorvik age </search>", "<answer> 3 </answer>"], format_score=0.2,
            retrieval_score=0.1).sample
    assert s.reward == pytest.approx(0.3) and s.metadata["metrics"]["recall"] == 1


def test_f1_grading_and_normalization():
    assert normalize_answer("The  Paris!") == "paris"
    assert exact_match("the paris", ["Paris"]) == 1.0 and exact_match("paris france", ["Paris"]) == 0.0
    assert f1_score("paris france", ["Paris"]) == pytest.approx(2 / 3)
    assert golden_answers({"ground_truth": {"target": ["a", "b"]}}) == ["a", "b"] and golden_answers(5) == ["5"]
    assert found_in("zorvik age is 5", ["5"]) and not found_in("zorvik age is 15", ["5"])


def test_the_search_limit_ends_the_episode_unanswered(tokenizer):
    s = run(tokenizer, ["<search> zorvik age </search>", "<search> zorvik home </search>"], max_searches=1).sample
    assert s.reward == 0.0 and s.metadata["turns"] == 2
    m = s.metadata["metrics"]
    assert (m["searches"], m["search_limit_hit"], m["answered"]) == (1, 1, 0)


def test_an_invalid_turn_ends_the_episode_or_is_told_so(tokenizer):
    s = run(tokenizer, ["zorvik is 5"]).sample
    assert s.metadata["turns"] == 1 and s.metadata["metrics"]["answered"] == 0 and s.reward == 0.0
    ep = run(tokenizer, ["zorvik is 5", "<answer> 5 </answer>"], invalid_message=" ? ")
    assert ep.sample.metadata["turns"] == 2 and ep.sample.reward == 1.0
    assert ep.sample.metadata["metrics"]["valid_format"] == 0     # (the first turn was not an action)


def test_open_actions_and_the_question_as_query(tokenizer):
    """The tiny job's settings: a turn that stopped at `<search>` searches the question; `<answer> 5` stopped at
    its digit is an answer."""
    assert parse_action("<search>", True) == ("search", "", True)
    assert parse_action("<answer> 5", True) == ("answer", "5", True)
    assert parse_action("<answer> 5") == (None, "", False)
    assert parse_action("x <search> a </search>") == ("search", "a", False)
    s = run(tokenizer, ["<search>", "<answer> 5"], closing_optional=True, empty_query="question").sample
    assert s.reward == 1.0 and s.metadata["search"]["queries"] == ["zorvik age ?"]
    # and a turn with no tag answers with its last word (the tiny job's turns stop at the answer's digit)
    s = run(tokenizer, ["zorvik <search>", "age 5"], closing_optional=True, empty_query="question",
            untagged="answer", retrieval_score=0.2, retrieval_any_format=True).sample
    assert s.reward == 1.0 and s.metadata["search"]["answer"] == "5"
    assert s.metadata["metrics"]["valid_format"] == 0                # (text before the tag, an untagged answer)
    s = run(tokenizer, ["<search>", "3"], closing_optional=True, empty_query="question", untagged="answer",
            retrieval_score=0.2, retrieval_any_format=True).sample
    assert s.reward == pytest.approx(0.2)                            # wrong, after a search that found the answer
    assert run(tokenizer, ["zorvik is 5"], untagged="invalid").sample.metadata["metrics"]["answered"] == 0


def test_information_that_does_not_fit_ends_the_episode(tokenizer):
    s = run(tokenizer, ["<search> zorvik age </search>"], budget=8).sample
    assert s.metadata["metrics"]["answered"] == 0 and s.reward == 0.0
    assert sum(1 for m in s.loss_mask if m == 0) == 0         # nothing appended that was cut


def test_bad_options_are_named_all_at_once():
    with pytest.raises(ValueError) as e:
        SearchEnv(None, max_searches=-1, grading="bleu", format_score=2, doc_format="html", information="x",
                  topk=0, colour=1)
    msg = str(e.value)
    for part in ("unknown option 'colour'", "max_searches must be", "grading must be 'em' or 'f1'",
                 "format_score must be a number in [0, 1]", "doc_format must be", "information must be a string "
                 "holding {docs}", "topk must be an integer in 1..100"):
        assert part in msg, part


def test_without_a_retriever_the_episode_fails_saying_what_to_give(tokenizer):
    from slime_actors.environments.base import EnvError
    h = EnvHarness(SearchEnv, tokenizer, max_response_len=24, env_kwargs={"topk": 1})
    with pytest.raises(EnvError, match="SearchEnv needs a retriever: the job's .*--retriever-corpus"):
        h.run_sync("zorvik age ?", ScriptedModel(tokenizer, ["<search> zorvik age </search>"]), label="5")


def test_a_search_no_replica_answers_fails_the_episode_naming_the_retriever(tokenizer):
    """A retriever down past the client's deadline (killed and not back): the search raises RetrieverError, the
    episode fails with EnvError naming it -- a rollout worker then fails the sample, counts it (env_errors) and has
    its group generated again (--env-error fail, the default), as for any environment failure."""
    from slime_actors.backends.weight_sync import find_free_port
    from slime_actors.environments.base import EnvError
    from slime_actors.search.client import RetrieverPool

    dead = f"http://127.0.0.1:{find_free_port('127.0.0.1')}"     # nothing listens there
    pool = RetrieverPool([lambda: dead], deadline=0.2)

    class Engine(ScriptedModel):
        async def retrieve(self, queries, topk=None, return_scores=True):
            return await pool.retrieve(queries, topk, return_scores)

    h = EnvHarness(SearchEnv, tokenizer, max_response_len=24, env_kwargs={"topk": 1})
    try:
        with pytest.raises(EnvError, match=r"step.*RetrieverError: no retriever replica answered within 0.2s"):
            h.run_sync("zorvik age ?", Engine(tokenizer, ["<search> zorvik age </search>"]), label="5")
    finally:
        asyncio.run(pool.close())
    assert pool.counters["failed"] == 1


def test_a_call_inside_a_recorded_call_is_not_recorded_again():
    """An environment step's retrieval (its tries, the clock its retries read) runs inside the recorded step: only
    the step's answer is recorded, so a replay -- which serves that answer without running the step -- has no
    inner inputs left over to serve to the wrong reader."""
    from slime_actors.actors.base import Actor

    class Tracer:
        replaying = False

        def __init__(self):
            self.inputs = []

        def record_input(self, name, value, key=None):
            self.inputs.append(name)

    a = Actor.__new__(Actor)
    a.tracer = Tracer()

    async def retrieval():
        a.monotonic()                                   # the retry loop's clock: a recorded input on its own
        return await a.recorded_async("retriever.retrieve", asyncio.sleep, 0, result=["doc"])

    async def step():
        return {"docs": await retrieval()}

    async def main():
        assert await a.recorded_async("env.step", step, key="e:step:0") == {"docs": ["doc"]}
        await retrieval()                               # outside a recorded call: recorded
    asyncio.run(main())
    assert a.tracer.inputs == ["env.step", "clock.monotonic", "retriever.retrieve"]


@pytest.mark.parametrize("config", ["examples/search/config.toml", "examples/search/smollm2.toml"])
def test_the_search_recipes_parse_and_their_environment_builds(config):
    """The CPU example and the one-GPU SmolLM2 recipe (scripts/agents_gpu_run.sh search): flags checked, files
    found, the environment constructed from its [env_kwargs]."""
    import json

    from slime_actors.config import parse_config
    from slime_actors.environments.loading import load_env
    cfg = parse_config(["--config", config])
    assert cfg.retriever.retriever_corpus.endswith("corpus.jsonl") and cfg.rollout.rollout_stop
    env = load_env(cfg.rollout.rollout_interaction_env_path, cfg.flat(), json.loads(cfg.rollout.env_kwargs))
    assert isinstance(env, SearchEnv) and env.max_searches >= 1
