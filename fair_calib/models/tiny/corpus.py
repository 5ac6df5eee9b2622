"""Deterministic synthetic corpus and task items for the embedded tiny diffusion LMs.

Everything is generated from one seed with :class:`random.Random`, so the same settings give
byte-identical files on every machine. The world is small and learnable in about a minute of
CPU training:

* arithmetic word problems with small numbers in a fixed GSM8K-like format
  ``Question: <q>\\nAnswer: a + b = c . #### c``;
* arithmetic drills (``3 + 4 = 7 . 9 - 2 = 7 .``) that teach the addition/subtraction table;
* a fixed ontology (``a sparrow is a bird .``), colours of made-up objects
  (``the blicket is red .``) and number comparisons, stated as facts and asked as questions.

Held-out items (calibration documents, probe problems, the second "facts" corpus and the two
tasks) are exact texts that never occur in ``train.txt``; for question-answer items the question
itself never occurs in a training document. The facts they need are all stated in training.

Newlines separate question and answer in the task files (GSM8K / ARC style). The tiny tokenizer
treats a newline as whitespace, so ``train.txt`` (one document per line) writes a space there and
tokenizes identically.
"""
from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fair_calib.jobs import io

PROMPT_TEMPLATE = "Question: {question}\nAnswer:"
INSTRUCTION = "Let's think step by step."

DEFAULT_CORPUS: dict[str, Any] = {
    "n_train_docs": 24000,
    "n_calib": 256,
    "n_probe": 128,
    "n_facts": 256,
    "n_mc": 200,
    "n_gen": 200,
    "max_number": 9,           # operands and results stay in 0..max_number
    # The world's made-up objects, each with a colour: the recall task asks their colours, so
    # the number of independent facts a task samples is this number (config/bench.yaml: many).
    "n_objects": 32,
    # What the multiple-choice task asks: "kind" (30 things of 5 kinds), "colour" (the objects).
    "mc_kinds": ["kind"],
    # What the generation task asks: "colour" (an object's memorised colour), "context" (a
    # colour stated in the question itself).
    "gen_kind": "colour",
    "instruction_frac": 0.25,  # share of training problems that carry INSTRUCTION
    # Recall questions (colour / kind of a thing) are what a tiny diffusion LM learns within
    # a minute of CPU training; the arithmetic word problems stay in the corpus as the GSM8K
    # stand-in that Stage I probes with, but copying numbers out of a question takes tiny
    # models thousands of steps, so no default task scores them.
    "mix": {"arith": 0.20, "drill": 0.05, "colour": 0.30, "kind": 0.20, "compare": 0.05,
            "facts": 0.20},
}

NAMES = ("Tom", "Anna", "Ben", "Mia", "Sam", "Lily", "Max", "Zoe", "Leo", "Ella", "Jack", "Nora",
         "Finn", "Ruby", "Owen", "Ivy", "Hugo", "Lucy", "Noah", "Emma", "Adam", "Kate", "Paul",
         "Rosa", "Alex", "Beth", "Carl", "Dana", "Eric", "Fay", "Gus", "Hana", "Ian", "Jill",
         "Kai", "Lena", "Milo", "Nina", "Otto", "Pia", "Quinn", "Rita", "Seth", "Tara", "Uma",
         "Vera", "Will", "Xena", "Yuri", "Zack", "Amy", "Bob", "Cleo", "Dave", "Eve", "Fred",
         "Gina", "Hank", "Iris", "Joel", "Kim", "Liam", "Maya", "Ned")
ITEMS = ("apples", "pens", "books", "cards", "coins", "shells", "stickers", "marbles", "cookies",
         "stamps", "balls", "eggs")
COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "white", "black")
KINDS: dict[str, tuple[str, ...]] = {
    "bird": ("sparrow", "robin", "eagle", "owl", "crow", "parrot"),
    "fish": ("salmon", "trout", "shark", "tuna", "cod", "carp"),
    "tree": ("oak", "pine", "maple", "birch", "elm", "willow"),
    "tool": ("hammer", "saw", "drill", "wrench", "chisel", "spade"),
    "fruit": ("mango", "pear", "plum", "cherry", "lemon", "grape"),
}
_ONSETS = ("bl", "d", "w", "z", "gr", "fl", "k", "m", "sn", "tr", "v", "pl", "j", "st")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("x", "p", "g", "ck", "rn", "t", "sk", "mp", "b", "ff")


def made_up_objects(n: int, seed: int) -> list[str]:
    """``n`` distinct pronounceable nonsense nouns (``blick``, ``zorp``, ...), fixed by seed."""
    rng = random.Random(f"objects-{seed}")
    taken = set(NAMES) | set(ITEMS) | set(COLOURS) | set(KINDS) | {w for v in KINDS.values() for w in v}
    out: list[str] = []
    while len(out) < n:
        w = rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
        if rng.random() < 0.4:
            w += rng.choice(("et", "o", "a", "y"))
        if w not in taken:
            taken.add(w)
            out.append(w)
    return out


@dataclass
class World:
    """The fixed facts every document and task item draws from."""
    seed: int
    max_number: int
    objects: list[str] = field(default_factory=list)
    colour_of: dict[str, str] = field(default_factory=dict)
    kind_of: dict[str, str] = field(default_factory=dict)

    @classmethod
    def build(cls, seed: int, max_number: int, n_objects: int = 32) -> "World":
        w = cls(seed=seed, max_number=max_number)
        w.objects = made_up_objects(n_objects, seed)
        rng = random.Random(f"colours-{seed}")
        w.colour_of = {o: rng.choice(COLOURS) for o in w.objects}
        w.kind_of = {x: k for k, xs in KINDS.items() for x in xs}
        return w


# ----------------------------------------------------------------------------- generators
# Each generator returns (question, answer, meta); the document is the question-answer pair in
# PROMPT_TEMPLATE format. ``answer`` has no leading space.

def _arith(rng: random.Random, world: World) -> tuple[str, str, dict]:
    m = world.max_number
    name, other = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    if rng.random() < 0.5:
        c = rng.randint(2, m)
        a = rng.randint(1, c - 1)
        b = c - a
        if rng.random() < 0.5:
            q = f"{name} has {a} {item} and gets {b} more . How many {item} does {name} have now ?"
        else:
            q = f"{name} has {a} {item} . {other} gives {name} {b} more . How many {item} does {name} have now ?"
        sol = f"{a} + {b} = {c} ."
    else:
        a = rng.randint(1, m)
        b = rng.randint(1, a)
        c = a - b
        if rng.random() < 0.5:
            q = f"{name} has {a} {item} and gives away {b} . How many {item} does {name} have left ?"
        else:
            q = f"{name} had {a} {item} and lost {b} of them . How many {item} are left ?"
        sol = f"{a} - {b} = {c} ."
    return q, f"{sol}\n#### {c}", {"kind": "arith", "result": c}


def _drill(rng: random.Random, world: World) -> str:
    m = world.max_number
    parts = []
    for _ in range(rng.randint(4, 7)):
        if rng.random() < 0.5:
            c = rng.randint(2, m)
            a = rng.randint(1, c - 1)
            parts.append(f"{a} + {c - a} = {c} .")
        else:
            a = rng.randint(1, m)
            b = rng.randint(0, a)
            parts.append(f"{a} - {b} = {a - b} .")
    return " ".join(parts)


def _colour_q(rng: random.Random, world: World) -> tuple[str, str, dict]:
    obj = rng.choice(world.objects)
    name = rng.choice(NAMES)
    form = rng.randrange(3)
    if form == 0:
        q = f"{name} found a {obj} . What colour is the {obj} ?"
    elif form == 1:
        q = f"What colour is the {obj} that {name} has ?"
    else:
        q = f"{name} paints a picture of a {obj} . Which colour does {name} use for the {obj} ?"
    gold = world.colour_of[obj]
    wrong = [c for c in COLOURS if c != gold]
    return q, gold, {"kind": "colour", "gold": gold, "distractors": rng.sample(wrong, 3)}


def _kind_q(rng: random.Random, world: World) -> tuple[str, str, dict]:
    x = rng.choice(sorted(world.kind_of))
    name = rng.choice(NAMES)
    form = rng.randrange(3)
    if form == 0:
        q = f"{name} saw a {x} . What kind of thing is a {x} ?"
    elif form == 1:
        q = f"What kind of thing is the {x} that {name} drew ?"
    else:
        q = f"{name} talks about a {x} . Is a {x} a bird , a fish , a tree , a tool or a fruit ?"
    gold = world.kind_of[x]
    wrong = [k for k in KINDS if k != gold]
    return q, gold, {"kind": "kind", "gold": gold, "distractors": rng.sample(wrong, 3)}


def _compare_q(rng: random.Random, world: World) -> tuple[str, str, dict]:
    m = world.max_number
    a, b = rng.sample(range(0, m + 1), 2)
    name, other = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    if rng.random() < 0.5:
        q = f"{name} has {a} {item} and {other} has {b} {item} . Does {name} have more {item} than {other} ?"
    else:
        q = f"Is {a} more than {b} ?"
    gold = "yes" if a > b else "no"
    return q, gold, {"kind": "compare", "gold": gold, "distractors": ["no" if gold == "yes" else "yes"]}


def _fact_sentence(rng: random.Random, world: World) -> str:
    r = rng.random()
    if r < 0.45:
        obj = rng.choice(world.objects)
        return rng.choice((f"the {obj} is {world.colour_of[obj]} .",
                           f"every {obj} is {world.colour_of[obj]} ."))
    if r < 0.8:
        x = rng.choice(sorted(world.kind_of))
        return rng.choice((f"a {x} is a {world.kind_of[x]} .", f"the {x} is a kind of {world.kind_of[x]} ."))
    a, b = rng.sample(range(0, world.max_number + 1), 2)
    lo, hi = min(a, b), max(a, b)
    return rng.choice((f"{hi} is more than {lo} .", f"{lo} is less than {hi} ."))


def _facts_doc(rng: random.Random, world: World) -> str:
    return " ".join(_fact_sentence(rng, world) for _ in range(rng.randint(3, 6)))


def _colour_recall(rng: random.Random, world: World) -> tuple[str, str, dict]:
    """A colour question answered in words, then ``#### colour`` (the generation task)."""
    q, gold, meta = _colour_q(rng, world)
    return q, f"it is {gold} .\n#### {gold}", meta


def _context_q(rng: random.Random, world: World) -> tuple[str, str, dict]:
    """In-context recall: a few people each hold an item of a colour drawn afresh for this
    question, and the question asks one of them. Nothing is memorised, so every item is an
    independent draw (the bench's tasks: thousands of independent items, where the recall
    task's 32 memorised colours make every item one of 32 facts). The distractors are the
    other colours of the context first, so answering needs the pairing, not a colour seen."""
    k = rng.randint(CONTEXT_PAIRS[0], CONTEXT_PAIRS[1])
    names = rng.sample(NAMES, k)
    colours = rng.sample(COLOURS, k)
    item = rng.choice(ITEMS)
    context = " ".join(f"{n} has {c} {item} ." for n, c in zip(names, colours))
    ask = rng.randrange(k)
    q = f"{context} What colour are the {item} of {names[ask]} ?"
    gold = colours[ask]
    others = [c for c in colours if c != gold]
    rest = [c for c in COLOURS if c not in colours]
    distractors = (others + rng.sample(rest, len(rest)))[:3]
    return q, gold, {"kind": "context", "gold": gold, "distractors": distractors}


def _context_recall(rng: random.Random, world: World) -> tuple[str, str, dict]:
    """In-context recall answered in words, then ``#### colour`` (a generation task)."""
    q, gold, meta = _context_q(rng, world)
    return q, f"it is {gold} .\n#### {gold}", meta


COPY_WORDS = COLOURS + NAMES[:24]   # what a copy question lists (one token each)
COPY_LENGTH = (3, 6)                # words a copy question lists


def _copy_words(rng: random.Random) -> list[str]:
    return rng.sample(COPY_WORDS, rng.randint(COPY_LENGTH[0], COPY_LENGTH[1]))


def _copy_recall(rng: random.Random, world: World) -> tuple[str, str, dict]:
    """Copying: a list of words drawn afresh is to be repeated, the whole list the answer
    (``#### red Tom blue``). Every item is an independent draw, and the answer is several
    tokens long, so the order in which a diffusion decoder commits them matters."""
    words = _copy_words(rng)
    return (f"Repeat : {' '.join(words)} .", f"#### {' '.join(words)}",
            {"kind": "copy", "gold": " ".join(words)})


def _copy_q(rng: random.Random, world: World) -> tuple[str, str, dict]:
    """Copying as multiple choice: the list, then the list with one word replaced, with two
    neighbours swapped, and with another word replaced (all of the list's length)."""
    words = _copy_words(rng)
    k = len(words)
    options = []
    for how in ("replace", "swap", "replace"):
        for _ in range(100):
            w = list(words)
            i = rng.randrange(k)
            if how == "swap":
                j = min(i + 1, k - 1) if i < k - 1 else i - 1
                w[i], w[j] = w[j], w[i]
            else:
                w[i] = rng.choice([x for x in COPY_WORDS if x not in words])
            if w != words and " ".join(w) not in options:
                options.append(" ".join(w))
                break
    gold = " ".join(words)
    return (f"Repeat : {gold} .", f"#### {gold}",
            {"kind": "copy", "gold": f"#### {gold}", "distractors": [f"#### {o}" for o in options]})


CONTEXT_PAIRS = (2, 4)     # people (and colours) in an in-context recall question
QA_GENERATORS = {"arith": _arith, "colour": _colour_recall, "kind": _kind_q,
                 "compare": _compare_q, "context": _context_recall, "copy": _copy_recall}
MC_GENERATORS = {"colour": _colour_q, "kind": _kind_q, "context": _context_q, "copy": _copy_q}
GEN_GENERATORS = {"colour": _colour_recall, "context": _context_recall, "copy": _copy_recall}


def format_qa(question: str, answer: str) -> str:
    return PROMPT_TEMPLATE.format(question=question) + " " + answer


def one_line(text: str) -> str:
    return " ".join(text.split())


# ----------------------------------------------------------------------------- the corpus

def _mix_choice(rng: random.Random, mix: dict[str, float]) -> str:
    keys = sorted(mix)
    total = sum(mix[k] for k in keys)
    r = rng.random() * total
    for k in keys:
        r -= mix[k]
        if r < 0:
            return k
    return keys[-1]


def _training_doc(rng: random.Random, world: World, corpus: dict) -> tuple[str, str | None]:
    """One training document (single line) and, for question-answer docs, its question."""
    kind = _mix_choice(rng, corpus["mix"])
    if kind == "drill":
        return _drill(rng, world), None
    if kind == "facts":
        return _facts_doc(rng, world), None
    q, a, _ = QA_GENERATORS[kind](rng, world)
    if kind == "arith" and rng.random() < corpus["instruction_frac"]:
        q = f"{q} {INSTRUCTION}"
    return one_line(format_qa(q, a)), one_line(q)


# Alternative spellings accepted in the ``corpus`` settings (config/config.yaml uses these).
CORPUS_ALIASES = {"n_calib_docs": "n_calib", "n_mc_items": "n_mc", "n_gen_items": "n_gen"}
_CORPUS_EXTRA_KEYS = {"seed", "n_eval_items"}


def normalise_corpus_settings(given: dict | None) -> dict[str, Any]:
    """Map aliases onto canonical keys; unknown keys are an error (a typo would otherwise be
    silently ignored)."""
    out: dict[str, Any] = {}
    for key, value in (given or {}).items():
        canon = CORPUS_ALIASES.get(key, key)
        if canon not in DEFAULT_CORPUS and canon not in _CORPUS_EXTRA_KEYS:
            known = sorted(set(DEFAULT_CORPUS) | _CORPUS_EXTRA_KEYS | set(CORPUS_ALIASES))
            raise KeyError(f"make-data: unknown corpus setting {key!r}; known: {known}")
        out[canon] = value
    return out


def build_corpus(settings: dict) -> dict[str, Any]:
    """All files' contents as Python objects (no I/O). Deterministic in ``settings``."""
    seed = int(settings.get("seed", 0))
    given = normalise_corpus_settings(settings.get("corpus"))
    corpus = {**DEFAULT_CORPUS, **given}
    corpus["mix"] = {**DEFAULT_CORPUS["mix"], **(corpus.get("mix") or {})}
    if "n_eval_items" in given:  # one knob for both task sizes unless set separately
        corpus["n_mc"] = given.get("n_mc", given["n_eval_items"])
        corpus["n_gen"] = given.get("n_gen", given["n_eval_items"])
    if "n_train_docs" in given:
        corpus["n_train_docs"] = given["n_train_docs"]
    seed = int(corpus.get("seed", seed))
    world = World.build(seed, int(corpus["max_number"]), int(corpus["n_objects"]))
    mc_kinds = tuple(corpus["mc_kinds"])
    unknown = [k for k in mc_kinds if k not in MC_GENERATORS]
    if corpus["gen_kind"] not in GEN_GENERATORS:
        raise ValueError(f"make-data: corpus.gen_kind {corpus['gen_kind']!r} must be one of "
                         f"{sorted(GEN_GENERATORS)}")
    if not mc_kinds or unknown:
        raise ValueError(f"make-data: corpus.mc_kinds {list(mc_kinds)} must name some of "
                         f"{sorted(MC_GENERATORS)}")

    rng = random.Random(f"train-{seed}")
    train: list[str] = []
    train_questions: set[str] = set()
    for _ in range(int(corpus["n_train_docs"])):
        doc, q = _training_doc(rng, world, corpus)
        train.append(doc)
        if q is not None:
            train_questions.add(q)
    # Every number of the world must be a token even if sampling missed one.
    train.append(" ".join(str(i) for i in range(0, 100)) + " .")
    train_set = set(train)

    seen_docs = set(train_set)
    seen_q = set(train_questions)

    def fresh_qa(gen, rng_h: random.Random, max_tries: int = 100000):
        for _ in range(max_tries):
            q, a, meta = gen(rng_h, world)
            q1 = one_line(q)
            if q1 in seen_q:
                continue
            seen_q.add(q1)
            return q, a, meta
        raise RuntimeError("could not draw a held-out item; enlarge the world or shrink the corpus")

    def fresh_doc(make, rng_h: random.Random, max_tries: int = 100000) -> str:
        for _ in range(max_tries):
            d = make(rng_h)
            if d not in seen_docs:
                seen_docs.add(d)
                return d
        raise RuntimeError("could not draw a held-out document")

    rng_c = random.Random(f"calib-{seed}")

    def calib_doc(r: random.Random) -> str:
        kind = _mix_choice(r, corpus["mix"])
        if kind == "drill":
            return _drill(r, world)
        if kind == "facts":
            return _facts_doc(r, world)
        q, a, _ = fresh_qa(QA_GENERATORS[kind], r)
        return one_line(format_qa(q, a))

    calib = [{"text": fresh_doc(calib_doc, rng_c)} for _ in range(int(corpus["n_calib"]))]

    rng_f = random.Random(f"facts-{seed}")
    facts = [{"text": fresh_doc(lambda r: _facts_doc(r, world), rng_f)}
             for _ in range(int(corpus["n_facts"]))]

    rng_p = random.Random(f"probe-{seed}")
    probe = []
    for _ in range(int(corpus["n_probe"])):
        q, a, _ = fresh_qa(_arith, rng_p)
        probe.append({"question": q, "answer": a})

    rng_a = random.Random(f"gen-{seed}")
    arith = []
    for _ in range(int(corpus["n_gen"])):
        q, a, _ = fresh_qa(GEN_GENERATORS[corpus["gen_kind"]], rng_a)
        arith.append({"question": q, "answer": a})

    rng_m = random.Random(f"mc-{seed}")
    mc = []
    for i in range(int(corpus["n_mc"])):
        q, a, meta = fresh_qa(MC_GENERATORS[mc_kinds[i % len(mc_kinds)]], rng_m)
        choices = [meta["gold"], *meta["distractors"]]
        rng_m.shuffle(choices)
        mc.append({"query": PROMPT_TEMPLATE.format(question=q),
                   "choices": [" " + c for c in choices],
                   "gold": choices.index(meta["gold"]),
                   "type": meta["kind"]})

    mc_chance = sum(1.0 / len(x["choices"]) for x in mc) / max(len(mc), 1)
    arith_results = [x["answer"].rsplit("####", 1)[1].strip() for x in arith]
    # chance for exact match: always answering the most frequent result
    majority = max(set(arith_results), key=arith_results.count) if arith_results else 0
    arith_chance = arith_results.count(majority) / max(len(arith_results), 1)
    manifest = {
        "seed": seed,
        "corpus": corpus,
        "counts": {"train": len(train), "calib": len(calib), "probe": len(probe),
                   "facts": len(facts), "synth_mc": len(mc), "synth_gen": len(arith)},
        "chance": {"synth_mc": mc_chance, "synth_gen": arith_chance},
        "prompt_template": PROMPT_TEMPLATE,
        "instruction": INSTRUCTION,
        "answer_regex": r"#### (\-?[0-9]+)",
        "world": {"objects": world.objects, "colour_of": world.colour_of, "kinds": KINDS},
    }
    return {"train": train, "calib": calib, "probe": probe, "facts": facts, "synth_mc": mc,
            "synth_gen": arith, "manifest": manifest}


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)


def make_data(settings: dict, out_dir: str | Path) -> dict[str, Any]:
    """Write the corpus and task files into ``out_dir`` (atomically, file by file)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = build_corpus(settings)
    io.write_text(out / "train.txt", "".join(d + "\n" for d in data["train"]))
    io.write_text(out / "calib.jsonl", _jsonl(data["calib"]))
    io.write_text(out / "probe.jsonl", _jsonl(data["probe"]))
    io.write_text(out / "facts.jsonl", _jsonl(data["facts"]))
    io.write_text(out / "synth_mc.jsonl", _jsonl(data["synth_mc"]))
    io.write_text(out / "synth_gen.jsonl", _jsonl(data["synth_gen"]))
    manifest = dict(data["manifest"])
    manifest["provenance"] = io.provenance(settings, seed=manifest["seed"])
    # manifest last: its presence marks a complete data folder
    io.write_json(out / "manifest.json", manifest)
    return manifest


def run_cli(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="fair-calib make-data",
                                 description="write the synthetic corpus and task files")
    ap.add_argument("--settings", required=True, help="JSON: {seed, corpus: {...}}")
    ap.add_argument("--out", required=True, help="output folder (resources/data)")
    args = ap.parse_args(argv)
    manifest = make_data(json.loads(args.settings), args.out)
    print(json.dumps({"counts": manifest["counts"], "chance": manifest["chance"]}))
