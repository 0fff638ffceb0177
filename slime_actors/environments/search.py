"""Search-then-answer on the environment API (Search-R1's protocol): the model searches, reads, and answers.

    --rollout-interaction-env-path slime_actors.environments.search:SearchEnv --retriever-corpus CORPUS
    --rollout-stop '["</search>", "</answer>"]'           # a turn ends at its action's closing tag

Each model turn is one action:

    <search> query </search>     the job's retriever is asked (topk: --retriever-topk); the documents come back as
                                 <information> ... </information> (not the model's: loss mask 0), and the model goes on
    <answer> text </answer>      the episode ends; the answer is graded against the sample's label

A turn with neither (or with text outside its tag) is invalid: the episode ends unanswered, or, with
`invalid_message` set, that text is the observation and the model tries again (Search-R1's "My previous action is
invalid..."). A search past `max_searches`, or one whose information would not fit in the token budget, ends the
episode unanswered.

The reward is the environment's (no reward function is called), computed from what it saw -- the model's own turns
and the documents it retrieved, so a model that writes its own `<information>` block is not credited for it:

    exact match (`grading = "em"`, Search-R1's normalization) or token F1 (`"f1"`) of the answer against the label
    (a string, a list of strings, or Search-R1's {"ground_truth": {"target": [...]}}); and, as Search-R1's
    qa_em_format, optional shaping (all 0 by default): `format_score` for a well-formed episode whose answer is
    wrong (plus `retrieval_score` when the label was in what it retrieved), `final_format_score` for an answer in an
    ill-formed one; a right answer in an ill-formed episode gets 1 - `format_score`. With `retrieval_any_format`
    (not Search-R1's), a wrong answer after a search that retrieved the label gets `retrieval_score` whatever the
    format.

Per episode, `sample.metadata["metrics"]` (numbers; the buffer logs their means per rollout as rollout/env/NAME and
per evaluation as eval/SET-NAME): `searches`, `searched` (0/1), `recall` (the label appears in the retrieved text:
0/1), `answered`, `correct` (the grade alone, without shaping), `valid_format`, `search_limit_hit`. The queries and
retrieved documents are in `sample.metadata["search"]`.

Options (--env-kwargs): max_searches (3), topk (the job's --retriever-topk), grading ("em" | "f1"), format_score,
retrieval_score, final_format_score (0), closing_optional (false: see parse_action), empty_query ("invalid";
"question": `<search> </search>` searches the sample's question as it is -- metadata["question"], else the prompt),
untagged ("invalid"; "answer": a turn with no action tag answers with its last word -- the tiny setting, whose
turns end at the answer's one token), doc_format ("search-r1": `Doc 1(Title: "T") text`, one a line; "text": the
texts alone, joined by spaces), information (the observation's template, `{docs}` in it; Search-R1's
"\\n\\n<information>{docs}</information>\\n\\n" by default), invalid_message (None), corpus (a jsonl corpus searched in
this process instead of the job's retriever: for the harness and tests).

Retrievals run inside the environment's step: the step's answer is what the rollout worker records (and a replay
serves); each search is also recorded as a tool call (`env.tool`, name "search") for reading, not a second time as a
retriever input (actors/base.py, IN_RECORDED_CALL).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

from .base import Env, EnvError, Step

ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
OPEN_ACTION = re.compile(r"<(search|answer)>((?:(?!</?(?:search|answer)>).)*)$", re.DOTALL)
TAGS = re.compile(r"</?(?:search|answer|information|think)>")
SEARCH_R1_INFORMATION = "\n\n<information>{docs}</information>\n\n"
SEARCH_R1_INVALID = ("\nMy previous action is invalid. If I want to search, I should put the query between <search> "
                     "and </search>. If I want to give the final answer, I should put the answer between <answer> "
                     "and </answer>. Let me try again.\n")
METRICS = ("searches", "searched", "recall", "answered", "correct", "valid_format", "search_limit_hit")


# ------------------------------------------------------------------------------------------------ grading
def normalize_answer(s: str) -> str:
    """Search-R1's (SQuAD's) normalization: lower case, no punctuation, no articles, single spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def golden_answers(label: Any) -> list[str]:
    """The label as a list of acceptable answers: a string, a list, or {"ground_truth": {"target": [...]}}."""
    if isinstance(label, dict):
        label = (label.get("ground_truth") or {}).get("target", label.get("target"))
    if isinstance(label, (list, tuple)):
        return [str(x) for x in label]
    return [] if label is None else [str(label)]


def exact_match(prediction: str, golds: list[str]) -> float:
    p = normalize_answer(prediction)
    return float(any(normalize_answer(g) == p for g in golds))


def f1_score(prediction: str, golds: list[str]) -> float:
    """Token F1 of the normalized prediction against the best of the golden answers."""
    best = 0.0
    p = normalize_answer(prediction).split()
    for g in golds:
        t = normalize_answer(g).split()
        common = sum((Counter(p) & Counter(t)).values())
        if common:
            prec, rec = common / len(p), common / len(t)
            best = max(best, 2 * prec * rec / (prec + rec))
    return best


def found_in(text: str, golds: list[str]) -> bool:
    """A golden answer appears in `text` (normalized; Search-R1's is_retrieval_correct)."""
    t = f" {normalize_answer(text)} "
    return any(f" {normalize_answer(g)} " in t for g in golds if normalize_answer(g))


def parse_action(text: str, closing_optional: bool = False) -> tuple[str | None, str, bool]:
    """(action, content, well_formed) of one model turn: the first <search>/<answer> block; well formed when it is
    the only thing in the turn (whitespace aside) and holds no other tag. `closing_optional`: a block left open at
    the turn's end counts as closed there (for jobs whose turns end at a stop token: the tag itself, a digit)."""
    m = ACTION.search(text)
    if m is None and closing_optional:
        m = OPEN_ACTION.search(text)
    if m is None:
        return None, "", False
    content = m.group(2).strip()
    outside = (text[:m.start()] + text[m.end():]).strip()
    return m.group(1), content, not outside and not TAGS.search(m.group(2))


def question_of(sample) -> str:
    """The question a sample asks: metadata["question"] (the example worlds have it), else its prompt's text."""
    q = sample.metadata.get("question") if isinstance(sample.metadata, dict) else None
    if isinstance(q, str) and q:
        return q
    p = sample.prompt
    return p if isinstance(p, str) else " ".join(str(m.get("content", "")) for m in p if isinstance(m, dict))


def format_docs(docs: list[dict], doc_format: str) -> str:
    """Retrieved documents ({"contents": '"Title"\\ntext', ...}) as the model reads them."""
    if doc_format == "text":
        return " ".join(d["contents"].partition("\n")[2] or d["contents"] for d in docs)
    out = ""
    for i, d in enumerate(docs, 1):
        title, _, text = d["contents"].partition("\n")
        out += f"Doc {i}(Title: {title}) {text}\n"
    return out


class SearchEnv(Env):
    max_turns = 8   # (--max-turns wins) searches + the answer; max_searches bounds the searches themselves

    def __init__(self, args: Any = None, **kwargs: Any):
        super().__init__(args, **kwargs)
        known = {"max_searches", "topk", "grading", "format_score", "retrieval_score", "final_format_score",
                 "doc_format", "information", "invalid_message", "corpus", "closing_optional", "empty_query", "retrieval_any_format", "untagged"}
        problems = [f"unknown option {k!r}" for k in sorted(set(kwargs) - known)]
        self.max_searches = kwargs.get("max_searches", 3)
        self.topk = kwargs.get("topk")
        self.grading = kwargs.get("grading", "em")
        self.scores = {k: kwargs.get(k, 0.0) for k in ("format_score", "retrieval_score", "final_format_score")}
        self.doc_format = kwargs.get("doc_format", "search-r1")
        self.information = kwargs.get("information", SEARCH_R1_INFORMATION)
        self.invalid_message = kwargs.get("invalid_message")
        self.corpus = kwargs.get("corpus")
        self.closing_optional = kwargs.get("closing_optional", False)
        self.empty_query = kwargs.get("empty_query", "invalid")
        self.retrieval_any_format = kwargs.get("retrieval_any_format", False)
        self.untagged = kwargs.get("untagged", "invalid")
        if self.untagged not in ("invalid", "answer"):
            problems.append(f"untagged must be 'invalid' or 'answer', got {self.untagged!r}")
        if not isinstance(self.retrieval_any_format, bool):
            problems.append(f"retrieval_any_format must be true or false, got {self.retrieval_any_format!r}")
        if not isinstance(self.closing_optional, bool):
            problems.append(f"closing_optional must be true or false, got {self.closing_optional!r}")
        if self.empty_query not in ("invalid", "question"):
            problems.append(f"empty_query must be 'invalid' or 'question', got {self.empty_query!r}")
        if not isinstance(self.max_searches, int) or isinstance(self.max_searches, bool) or self.max_searches < 0:
            problems.append(f"max_searches must be an integer >= 0, got {self.max_searches!r}")
        if self.topk is not None and (not isinstance(self.topk, int) or isinstance(self.topk, bool)
                                      or not 1 <= self.topk <= 100):
            problems.append(f"topk must be an integer in 1..100, got {self.topk!r}")
        if self.grading not in ("em", "f1"):
            problems.append(f"grading must be 'em' or 'f1', got {self.grading!r}")
        for k, v in self.scores.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                problems.append(f"{k} must be a number in [0, 1], got {v!r}")
        if self.doc_format not in ("search-r1", "text"):
            problems.append(f"doc_format must be 'search-r1' or 'text', got {self.doc_format!r}")
        if not isinstance(self.information, str) or "{docs}" not in self.information:
            problems.append(f"information must be a string holding {{docs}}, got {self.information!r}")
        if self.invalid_message is not None and not (isinstance(self.invalid_message, str) and self.invalid_message):
            problems.append(f"invalid_message must be a non-empty string or left out, got {self.invalid_message!r}")
        if self.corpus is not None and not isinstance(self.corpus, str):
            problems.append(f"corpus must be a path, got {self.corpus!r}")
        if problems:
            raise ValueError("SearchEnv (--env-kwargs): " + "; ".join(problems))
        self.index = None

    async def setup(self) -> None:
        if self.corpus is not None:
            from ..search.index import Bm25Index
            self.index = Bm25Index.open(self.corpus)

    # ------------------------------------------------------------------------------------------ the episode
    async def reset(self, sample) -> None:
        self.episode.state.update(searches=[], retrieved="", valid=True, limit=False)
        return None

    async def step(self, sample, turn) -> Step:
        st = self.episode.state
        action, content, well_formed = parse_action(turn.text, self.closing_optional)
        st["valid"] = st["valid"] and well_formed
        if action is None and self.untagged == "answer" and turn.text.split():
            return self._end(sample, turn.text.split()[-1])     # (a turn that ended at its answer: the last word)
        if action == "answer":
            return self._end(sample, content)
        if action == "search" and not content and self.empty_query == "question":
            content = question_of(sample)
        if action == "search" and content and not turn.last:
            if len(st["searches"]) >= self.max_searches:
                st["limit"] = True
                return self._end(sample, None)
            docs = await self.call_tool("search", self._search, content)
            st["searches"].append({"query": content, "docs": [d.get("id") for d in docs]})
            text = format_docs(docs, self.doc_format)
            st["retrieved"] += " " + text
            observation = self.information.replace("{docs}", text)
            if not self._fits(observation, turn.tokens_left):
                return self._end(sample, None)
            return Step(observation)
        st["valid"] = False
        if self.invalid_message is not None and not turn.last and self._fits(self.invalid_message, turn.tokens_left):
            return Step(self.invalid_message)
        return self._end(sample, None)

    async def _search(self, query: str) -> list[dict]:
        """The documents for `query`, best first: from the job's retriever, or this process's index (`corpus`)."""
        if self.index is not None:
            k = self.topk or 3
            return [d.to_json() for d, _ in self.index.search([query], k)[0]]
        engine = self.episode.engine
        retrieve = getattr(engine, "retrieve", None)
        if retrieve is None:
            raise EnvError("SearchEnv needs a retriever: the job's (--retriever-corpus or --retriever-url), or a "
                           "corpus in --env-kwargs")
        answer = await retrieve([query], self.topk)
        return [hit["document"] if isinstance(hit, dict) and "document" in hit else hit for hit in answer["result"][0]]

    def _fits(self, text: str, tokens_left: int) -> bool:
        """Room for `text` and an answer of a few tokens after it."""
        tok = getattr(self.episode.engine, "tokenizer", None)
        if tok is None:
            return True
        return len(tok(text, add_special_tokens=False)["input_ids"]) + 3 <= tokens_left

    def _end(self, sample, answer: str | None) -> Step:
        st = self.episode.state
        golds = golden_answers(sample.label)
        answered = answer is not None
        grade = 0.0
        if answered and golds:
            grade = exact_match(answer, golds) if self.grading == "em" else f1_score(answer, golds)
        recall = bool(st["searches"]) and found_in(st["retrieved"], golds)
        valid = answered and st["valid"]
        fs, rs, ffs = self.scores["format_score"], self.scores["retrieval_score"], self.scores["final_format_score"]
        if grade > 0:
            reward = grade if valid else grade * (1.0 - fs)
        elif valid:
            reward = fs + (rs if recall else 0.0)
        elif answered:
            reward = ffs + (rs if recall and self.retrieval_any_format else 0.0)
        else:
            reward = 0.0
        n = len(st["searches"])
        metrics = {"searches": n, "searched": int(n > 0), "recall": int(recall), "answered": int(answered),
                   "correct": grade, "valid_format": int(valid), "search_limit_hit": int(st["limit"])}
        meta = {"metrics": {**(sample.metadata.get("metrics") or {}), **metrics},
                "search": {"queries": [s["query"] for s in st["searches"]], "docs": [s["docs"] for s in st["searches"]],
                           "answer": answer}}
        return Step(done=True, reward=float(reward), metadata=meta)
