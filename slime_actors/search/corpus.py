"""Corpora: read one (checked), hash it, or generate the example worlds -- made-up facts about made-up entities,
so that no model knows them and searching is the only way to answer.

    docs = read_corpus("examples/search/tiny/corpus.jsonl")     # [Doc], CorpusError naming every bad line
    corpus_hash("examples/search/tiny/corpus.jsonl")            # sha256 of the file (the index cache's key)
    world = tiny_world(seed=7)                                   # World(docs, train, heldout)
    world.write("examples/search/tiny")                          # corpus.jsonl, train.jsonl, heldout.jsonl

    python -m slime_actors.search.corpus --variant tiny --seed 7 --out examples/search/tiny
    python -m slime_actors.search.corpus --variant natural --seed 7 --out examples/search/natural

A corpus file is jsonl in Search-R1's format: one object per line, `{"id": "...", "contents": "\\"Title\\"\\ntext"}`
(the title in double quotes on the first line, the text after it), or `{"id", "title", "text"}`.

The two worlds (docs/search.md has examples of each):

* tiny -- for the tiny model (`tiny:search`, slime_actors/models/tiny.py), whose word-level vocabulary knows only
  its own words: 32 made-up entities (`zorvik`, `quelby`, ...) with 4 attributes each (`age`, `home`, `color`,
  `size`), each value a random digit. One document per fact, `zorvik age is 7`; the question is `zorvik age ?`, the
  answer `7`. The held-out questions are one attribute of each of 26 entities, whose answers no training question
  holds; every entity is still seen in training (its token is trained).
* natural -- for a real model (SmolLM2): made-up people (`Dravik Quelmoran`) with a birthplace (a made-up town), a
  birth year and a profession, one document each with a few sentences; first names and surnames are shared among
  people so a search must use the whole name. Questions are English ("In which town was Dravik Quelmoran born?");
  the held-out people are asked about only there.

Every row of train.jsonl / heldout.jsonl is in the project's prompt-data format (slime_actors/data.py): `input`
(the prompt), `label` (the answer), `metadata` (`question`, `entity`, `attribute`, `doc_id`: the document that
holds the answer), and `reward_model` as Search-R1's data has it (`{"ground_truth": {"target": [answer]}}`, for a
slime search-r1 reward function given `--label-key reward_model`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..json_files import not_regular, parse_json

MAX_DOC_CHARS = 1 << 20        # one document's contents
MAX_ERRORS_SHOWN = 20


class CorpusError(ValueError):
    """A corpus file that cannot be served; the message names the file and every bad line (up to 20)."""


@dataclass(frozen=True)
class Doc:
    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """Search-R1's form: the title in double quotes, a newline, the text."""
        return f'"{self.title}"\n{self.text}'

    def to_json(self) -> dict:
        """What the retriever answers for this document (Search-R1's fields: id, contents; and title, text)."""
        return {"id": self.id, "contents": self.contents, "title": self.title, "text": self.text}


def split_contents(contents: str) -> tuple[str, str]:
    """'"Title"\\ntext' -> (Title, text); contents without a newline are all text, with no title."""
    first, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents
    return first.strip().strip('"'), rest


def corpus_hash(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_corpus(path: str | os.PathLike) -> list[Doc]:
    """Every document of a jsonl corpus, checked: each line an object with a string or integer `id` (unique) and
    either `contents` or `title` and `text` (strings, at most MAX_DOC_CHARS). CorpusError names the file and the
    bad lines -- all of them, up to MAX_ERRORS_SHOWN -- or an empty corpus."""
    p = Path(path)
    what = not_regular(p)
    if what is not None and what != "no such file":   # (a FIFO would block the read)
        raise CorpusError(f"corpus {p}: {what}, not a jsonl file")
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise CorpusError(f"corpus {p}: no such file") from None
    except OSError as exc:
        raise CorpusError(f"corpus {p}: cannot read it: {exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorpusError(f"corpus {p}: not UTF-8 ({exc})") from None
    docs: list[Doc] = []
    errors: list[str] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = _doc_of(parse_json(line))
        except json.JSONDecodeError as exc:
            errors.append(f"line {n}: not JSON ({exc.msg})")
            continue
        except ValueError as exc:
            errors.append(f"line {n}: {exc}")
            continue
        if doc.id in seen:
            errors.append(f"line {n}: id {doc.id!r} already on line {seen[doc.id]}")
            continue
        seen[doc.id] = n
        docs.append(doc)
    if errors:
        shown = "; ".join(errors[:MAX_ERRORS_SHOWN])
        more = f" (and {len(errors) - MAX_ERRORS_SHOWN} more)" if len(errors) > MAX_ERRORS_SHOWN else ""
        raise CorpusError(f"corpus {p}: {len(errors)} bad line(s): {shown}{more}")
    if not docs:
        raise CorpusError(f"corpus {p}: no documents")
    return docs


def _doc_of(row) -> Doc:
    if not isinstance(row, dict):
        raise ValueError(f"expected an object, got {type(row).__name__}")
    doc_id = row.get("id")
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or doc_id == "":
        raise ValueError("`id` must be a non-empty string or an integer")
    if "contents" in row:
        contents = row["contents"]
        if not isinstance(contents, str):
            raise ValueError(f"`contents` must be a string, got {type(contents).__name__}")
        title, body = split_contents(contents)
    elif "title" in row and "text" in row:
        title, body = row["title"], row["text"]
        if not isinstance(title, str) or not isinstance(body, str):
            raise ValueError("`title` and `text` must be strings")
    else:
        raise ValueError("needs `contents` (\"Title\"\\ntext) or `title` and `text`")
    if len(title) + len(body) > MAX_DOC_CHARS:
        raise ValueError(f"document longer than {MAX_DOC_CHARS} characters")
    return Doc(str(doc_id), title, body)


# ---------------------------------------------------------------------------------------------------------------
# the example worlds

@dataclass
class World:
    docs: list[Doc]
    train: list[dict] = field(default_factory=list)
    heldout: list[dict] = field(default_factory=list)

    def write(self, out_dir: str | os.PathLike) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "corpus.jsonl", "w") as f:
            for d in self.docs:
                f.write(json.dumps({"id": d.id, "contents": d.contents}) + "\n")
        for name, rows in (("train.jsonl", self.train), ("heldout.jsonl", self.heldout)):
            with open(out / name, "w") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
        return out


def qa_row(prompt: str, question: str, answer: str, entity: str, attribute: str, doc_id: str) -> dict:
    return {"input": prompt, "label": answer,
            "metadata": {"question": question, "entity": entity, "attribute": attribute, "doc_id": doc_id},
            "reward_model": {"ground_truth": {"target": [answer]}, "style": "rule"}}


def tiny_world(seed: int = 7, heldout_entities: int = 26) -> World:
    """The tiny model's world (module docstring). Every word is in tiny:search's vocabulary."""
    from ..models.tiny import SEARCH_ATTRIBUTES, SEARCH_ENTITIES
    rng = random.Random(seed)
    docs, facts = [], []
    for e in SEARCH_ENTITIES:
        for a in SEARCH_ATTRIBUTES:
            value = str(rng.randrange(10))
            doc = Doc(f"{e}-{a}", e, f"{e} {a} is {value}")
            docs.append(doc)
            facts.append((e, a, value, doc.id))
    if not 0 <= heldout_entities <= len(SEARCH_ENTITIES):
        raise ValueError(f"heldout_entities must be 0..{len(SEARCH_ENTITIES)}")
    held = set()
    for e in rng.sample(SEARCH_ENTITIES, heldout_entities):   # one attribute each: the entity stays in training
        held.add((e, rng.choice(SEARCH_ATTRIBUTES)))
    world = World(docs)
    for e, a, value, doc_id in facts:
        q = f"{e} {a} ?"
        (world.heldout if (e, a) in held else world.train).append(qa_row(q, q, value, e, a, doc_id))
    rng.shuffle(world.train)
    return world


# syllables of the natural world's names: put together they make no word of English (or, we hope, of any language);
# the test holds every name to "not one token of SmolLM2's vocabulary", where the words of its text live
_ONSETS = ["br", "dr", "gr", "kv", "qu", "th", "v", "z", "sk", "pl", "fr", "m", "n", "t", "l", "k", "j", "vr"]
_VOWELS = ["a", "e", "i", "o", "u", "a", "o", "ae"]
_CODAS = ["", "", "", "r", "n", "k", "x", "v", "z", "l", "m"]
_TOWN_ENDINGS = ["dal", "mere", "vik", "holt", "stad", "brek", "wyn", "gard"]
PROFESSIONS = ["glassblower", "cartographer", "beekeeper", "clockmaker", "ferryman", "weaver", "astronomer",
               "bookbinder", "shipwright", "cooper", "herbalist", "stonemason", "lamplighter", "tanner", "falconer",
               "locksmith"]
NATURAL_ATTRIBUTES = ["birthplace", "birth year", "profession"]

PROMPT = ("Answer the question. Think first; when you lack a fact, search for it by writing a query between <search> "
          "and </search>: the top results come back between <information> and </information>. Search as often as you "
          "need. Give the final answer, and nothing else, between <answer> and </answer>, for example "
          "<answer> Paris </answer>.\nQuestion: {question}\n")


def _name(rng: random.Random, syllables: int) -> str:
    parts = []
    for _ in range(syllables):
        parts.append(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS))
    return "".join(parts).capitalize()


def _names(rng: random.Random, n: int, syllables: tuple[int, int], taken: set[str]) -> list[str]:
    out = []
    while len(out) < n:
        name = _name(rng, rng.randint(*syllables))
        if len(name) >= 5 and name not in taken:
            taken.add(name)
            out.append(name)
    return out


def natural_world(seed: int = 7, people: int = 300, heldout_people: int = 50) -> World:
    """The natural-language world (module docstring)."""
    if not 0 <= heldout_people < people:
        raise ValueError("heldout_people must be 0..people-1")
    rng = random.Random(seed)
    taken: set[str] = set()
    # fewer first names and surnames than people: each is shared, so a query needs the whole name
    firsts = _names(rng, max(2, people // 4), (2, 2), taken)
    lasts = _names(rng, max(2, people // 3), (2, 3), taken)
    towns = [n + e for n, e in zip(_names(rng, max(2, people // 5), (1, 2), taken),
                             (rng.choice(_TOWN_ENDINGS) for _ in range(people)))]
    full_names: set[str] = set()
    docs: list[Doc] = []
    questions: list[tuple[int, dict]] = []
    i = 0
    while len(docs) < people:
        name = f"{rng.choice(firsts)} {rng.choice(lasts)}"
        if name in full_names:
            continue
        full_names.add(name)
        town, year, job = rng.choice(towns), str(rng.randint(1600, 1999)), rng.choice(PROFESSIONS)
        pronoun = rng.choice(["He", "She"])
        a_job = ("an " if job[0] in "aeiou" else "a ") + job
        text = rng.choice([
            f"{name} was {a_job} born in {town} in {year}. {pronoun} is remembered for work done far from home.",
            f"Born in {year} in the town of {town}, {name} worked as {a_job} for most of a long life.",
            f"{name} ({year}) was {a_job}. {pronoun} was born in {town} and kept a small workshop there.",
        ])
        doc = Doc(f"p{i:05d}", name, text)
        docs.append(doc)
        for attribute, question, answer in (
                ("birthplace", f"In which town was {name} born?", town),
                ("birth year", f"In what year was {name} born?", year),
                ("profession", f"What was {name}'s profession?", job)):
            questions.append((i, qa_row(PROMPT.format(question=question), question, answer, name, attribute,
                                        doc.id)))
        i += 1
    held = set(rng.sample(range(people), heldout_people))
    world = World(docs)
    for person, row in questions:
        (world.heldout if person in held else world.train).append(row)
    rng.shuffle(world.train)
    return world


WORLDS = {"tiny": tiny_world, "natural": natural_world}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m slime_actors.search.corpus",
                                description="Write a made-up world: corpus.jsonl, train.jsonl, heldout.jsonl.")
    p.add_argument("--variant", choices=sorted(WORLDS), required=True)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", required=True, help="directory to write the three files to")
    p.add_argument("--people", type=int, default=300, help="natural: people in the world")
    ns = p.parse_args(argv)
    world = tiny_world(ns.seed) if ns.variant == "tiny" else natural_world(ns.seed, people=ns.people,
                                                                           heldout_people=max(1, ns.people // 6))
    out = world.write(ns.out)
    print(f"{out}: {len(world.docs)} documents, {len(world.train)} training and {len(world.heldout)} held-out "
          "questions", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
