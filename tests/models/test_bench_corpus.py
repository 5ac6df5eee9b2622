"""The bench's tasks (config/bench.yaml): copy and in-context recall items are independent draws,
their formats are what the tasks score, and the default's corpus is unchanged by the new keys."""
from __future__ import annotations

import re
from collections import Counter

import pytest
import yaml

from fair_calib.models.tiny import corpus as C

BENCH = {"n_train_docs": 600, "mix": {"copy": 0.5}, "mc_kinds": ["copy"], "gen_kind": "copy",
         "n_mc": 300, "n_gen": 300, "n_calib": 16, "n_probe": 8, "n_facts": 8}


def test_the_default_tasks_ask_few_facts_and_the_bench_many_draws():
    """Why the default's seeds spread: its 200 recall items ask the colours of 32 objects and its
    200 multiple-choice items the kinds of 30 things, so items move together; the bench's copy
    lists are drawn afresh (nearly every item its own)."""
    default = C.build_corpus({"seed": 0, "corpus": {"n_train_docs": 600}})
    objects = Counter(re.search(r"the (\w+)(?: that| \?|$)", d["question"]).group(1)
                      for d in default["synth_gen"])
    assert len(objects) <= 32
    things = Counter(re.search(r"(?:a|the) (\w+)(?: that| \.| \?)", d["query"]).group(1)
                     for d in default["synth_mc"])
    assert len(things) <= 30
    bench = C.build_corpus({"seed": 0, "corpus": BENCH})
    lists = Counter(d["answer"] for d in bench["synth_gen"])
    assert len(lists) == len(bench["synth_gen"]) == 300


def test_copy_items_have_the_formats_their_tasks_score():
    data = C.build_corpus({"seed": 0, "corpus": BENCH})
    for item in data["synth_gen"]:
        words = re.fullmatch(r"Repeat : (.+) \.", item["question"]).group(1)
        assert item["answer"] == f"#### {words}"
        assert C.COPY_LENGTH[0] <= len(words.split()) <= C.COPY_LENGTH[1]
    for item in data["synth_mc"]:
        words = re.fullmatch(r"Question: Repeat : (.+) \.\nAnswer:", item["query"]).group(1)
        choices = [c.strip() for c in item["choices"]]
        assert choices[item["gold"]] == f"#### {words}"
        assert len(set(choices)) == 4                           # four different options
        assert {len(c.split()) for c in choices} == {len(words.split()) + 1}   # same length
    text = (C.Path(C.__file__).parents[2] / "evaluate/tasks/synth_copy.yaml").read_text()
    pattern = re.search(r'regex_pattern: "(.+)"', text).group(1).replace("\\\\", "\\")
    assert re.search(pattern, "#### red Tom blue . Question").group(1) == "red Tom blue"
    assert re.search(pattern, "it is #### red").group(1) == "red"


def test_context_items_ask_a_colour_the_question_states():
    data = C.build_corpus({"seed": 0, "corpus": {**BENCH, "mix": {"context": 0.5},
                                                 "mc_kinds": ["context"], "gen_kind": "context"}})
    for item in data["synth_gen"]:
        pairs = dict(re.findall(r"(\w+) has (\w+) \w+ \.", item["question"]))
        who = re.search(r"of (\w+) \?", item["question"]).group(1)
        assert item["answer"].endswith(f"#### {pairs[who]}")


def test_bad_task_kinds_are_refused_by_key():
    with pytest.raises(ValueError, match="corpus.gen_kind 'nope'"):
        C.build_corpus({"seed": 0, "corpus": {**BENCH, "gen_kind": "nope"}})
    with pytest.raises(ValueError, match="corpus.mc_kinds"):
        C.build_corpus({"seed": 0, "corpus": {**BENCH, "mc_kinds": ["nope"]}})


def test_the_bench_config_asks_the_copy_task():
    from pathlib import Path

    cfg = yaml.safe_load((Path(__file__).parents[2] / "config/bench.yaml").read_text())
    assert cfg["corpus"]["gen_kind"] == "copy"
    assert cfg["tasks"]["synth_gen"]["lm_eval_task"] == "synth_copy"
