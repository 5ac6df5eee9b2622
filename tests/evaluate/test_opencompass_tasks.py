"""The oc_*.yaml tasks (the LLaDA authors' OpenCompass recipes) against OpenCompass 0.5.4.

``fixtures/opencompass/expected_0.5.4.json`` was recorded by ``record_opencompass.py`` (in an
environment of its own: OpenCompass cannot be installed beside this project) from the invented
documents of ``docs.json``: the chat turns OpenCompass's loaders, retrievers, prompt templates
and LLaDA's ``LLaDAModel`` hand to ``tokenizer.apply_chat_template``, its references, and what
its post-processors extract from fixed outputs. Here the same documents go through the
project's tasks and lm-eval's own chat / multi-turn few-shot mechanism, and the turns,
references and extracted answers must be identical.
"""
import json
import shutil
from pathlib import Path

import pytest

from fair_calib.evaluate import offline_data

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "opencompass"
DOCS = json.loads((FIX / "docs.json").read_text())
EXPECTED = json.loads((FIX / "expected_0.5.4.json").read_text())
TASKS = offline_data.TEMPLATE_DIR


def _load_utils():
    import importlib.util
    spec = importlib.util.spec_from_file_location("oc_fc_task_utils", TASKS / "fc_task_utils.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


utils = _load_utils()


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def task_manager(tmp_path_factory):
    """The five recipes rendered over the invented documents (hub rows' schema)."""
    from lm_eval.tasks import TaskManager

    tmp = tmp_path_factory.mktemp("oc")
    inc = tmp / "tasks"
    inc.mkdir()
    shutil.copy(TASKS / "fc_task_utils.py", inc / "fc_task_utils.py")
    for name, key in (("oc_arc_c_gen", "arc"), ("oc_hellaswag_gen", "hellaswag"),
                      ("oc_gsm8k_gen", "gsm8k"), ("oc_humaneval_gen", "humaneval"),
                      ("oc_piqa_gen", "piqa"), ("oc_boolq_gen", "boolq"),
                      ("oc_winogrande_gen", "winogrande"), ("oc_arc_e_gen", "arc_e")):
        data = _jsonl(tmp / f"{key}.jsonl", DOCS[key])
        text = offline_data._render((TASKS / f"{name}.yaml").read_text(),
                                    offline_data._local_json(data))
        (inc / f"{name}.yaml").write_text(text)
    mmlu = DOCS["mmlu"]
    files = {split: str(_jsonl(tmp / f"mmlu_{split}.jsonl", mmlu[split])) for split in ("test", "dev")}
    (inc / "oc_mmlu_one.yaml").write_text(offline_data.oc_mmlu_subject_yaml(
        mmlu["subject"], {"DATASET_PATH": "json", "DATASET_NAME": None,
                          "DATASET_KWARGS": {"data_files": files}}))
    return TaskManager(include_path=str(inc), include_defaults=False)


def _turns(tm, name):
    """(chat turns lm-eval hands to the model's apply_chat_template, doc) per document, with
    the task's own few-shot count, chat template on and few-shot as multi-turn."""
    task = tm.load([name])["tasks"][name]
    task.set_fewshot_seed(1234)
    task.build_all_requests(rank=0, world_size=1, apply_chat_template=True,
                            fewshot_as_multiturn=True,
                            chat_template=lambda msgs, add_generation_prompt=True: json.dumps(
                                [msgs, add_generation_prompt]),
                            tokenizer_name="recorder")
    out = []
    for inst in sorted(task.instances, key=lambda i: i.doc_id):
        msgs, gen_prompt = json.loads(inst.args[0])
        assert gen_prompt is True                       # the assistant turn is opened
        assert inst.args[1]["until"] == []              # no stop strings (OpenCompass has none)
        out.append((msgs, inst.doc))
    return out


@pytest.mark.parametrize("name,config,column", [
    ("oc_arc_c_gen", "ARC_c/ARC_c_gen_1e0de5.py", "answerKey"),
    ("oc_hellaswag_gen", "hellaswag/hellaswag_gen_6faab5.py", "label"),
    (f"oc_mmlu_gen_{DOCS['mmlu']['subject']}", "mmlu/mmlu_gen_a484b3.py", "target"),
    ("oc_gsm8k_gen", "gsm8k/gsm8k_gen_1d7fe4.py", "answer"),
    ("oc_humaneval_gen", "humaneval/humaneval_gen_8e312c.py", "task_id"),
    ("oc_piqa_gen", "piqa/piqa_gen_1194eb.py", "answer"),
    ("oc_boolq_gen", "SuperGLUE_BoolQ/SuperGLUE_BoolQ_gen_883d50.py", "label"),
    ("oc_winogrande_gen", "winogrande/winogrande_gen_458220.py", "answer"),
    ("oc_arc_e_gen", "ARC_e/ARC_e_gen_1e0de5.py", "answerKey")])
def test_chat_turns_equal_opencompass(task_manager, name, config, column):
    want = EXPECTED["prompts"][config]
    got = _turns(task_manager, name)
    assert len(got) == len(want)          # ARC: the 5-choice and 3-choice questions dropped
    for (msgs, doc), ref in zip(got, want):
        assert msgs == ref["messages"]
        assert doc[column] == ref["reference"]


def test_first_option_postprocess_equals_opencompass():
    outs = DOCS["outputs"]["first_option"]
    assert [utils.first_option_postprocess(t, "ABCD") for t in outs] == \
        EXPECTED["first_option_postprocess"]
    assert [utils.first_option_postprocess(t, "AB") for t in outs] == \
        EXPECTED["first_option_postprocess_AB"]
    assert [utils.first_capital_postprocess(t) for t in DOCS["outputs"]["first_capital"]] == \
        EXPECTED["first_capital_postprocess"]


def test_first_option_patterns_transcribed():
    """The pattern list as OpenCompass 0.5.4's source evaluates it (recorded from its
    ``first_option_postprocess``): 50 patterns in order, one of them two source lines joined
    for want of a comma."""
    pats = utils._first_option_patterns("ABCD")
    assert pats == EXPECTED["first_option_patterns_ABCD"]
    assert "故选?\\s*([ABCD])只有选?项?\\s?([ABCD])\\s?是?对" in pats


def test_gsm8k_and_humaneval_postprocessors_equal_opencompass():
    outs = DOCS["outputs"]
    assert [utils.gsm8k_postprocess(t) for t in outs["gsm8k"]] == EXPECTED["gsm8k_postprocess"]
    assert [utils.gsm8k_is_equal(utils.gsm8k_postprocess(t), r)
            for t, r in zip(outs["gsm8k"], outs["gsm8k_refs"])] == EXPECTED["gsm8k_is_equal"]
    assert [utils.gsm8k_dataset_postprocess(d["answer"]) for d in DOCS["gsm8k"]] == \
        EXPECTED["gsm8k_dataset_postprocess"]
    assert [utils.humaneval_postprocess_v2(t) for t in outs["humaneval"]] == \
        EXPECTED["humaneval_postprocess_v2"]


def test_scores_use_the_extracted_answers(task_manager):
    arc = task_manager.load(["oc_arc_c_gen"])["tasks"]["oc_arc_c_gen"]
    doc = list(arc.eval_docs)[0]                                   # answerKey B
    assert arc.process_results(doc, ["The answer is B."]) == {"acc": 1.0}
    assert arc.process_results(doc, ["C"]) == {"acc": 0.0}
    gsm = task_manager.load(["oc_gsm8k_gen"])["tasks"]["oc_gsm8k_gen"]
    doc = list(gsm.eval_docs)[1]                                   # #### 2,400
    assert gsm.process_results(doc, ["2400 pens.\nQuestion: 1+1\nAnswer: 2"]) == {"acc": 1.0}
    assert gsm.process_results(doc, ["2,400 pens"]) == {"acc": 0.0}    # "400", as OpenCompass
    he = DOCS["humaneval"][0]
    assert utils.oc_humaneval_predictions([["```python\n    return a + b\n```"]], [he]) == \
        [[he["prompt"] + "return a + b\n"]]


def test_lm_renders_chat_as_opencompass_llada(tmp_path):
    """The model class renders lm-eval's turns with the tokenizer's template as LLaDA's
    ``LLaDAModel.generate`` does (``apply_chat_template(m, add_generation_prompt=True,
    tokenize=False)``), and with ``chat_add_special_tokens`` tokenizes the text as its
    ``batch_encode_plus`` (the tokenizer's special prefix added)."""
    from fixtures.hub_checkpoints import llada_checkpoint

    from fair_calib.evaluate.lm import DiffusionLM
    from fair_calib.models.adapters import load_model

    llada_checkpoint(tmp_path / "m")
    loaded = load_model(tmp_path / "m", "llada")
    tok = loaded.tokenizer
    tok.chat_template = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
                         "<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
                         "{% if add_generation_prompt %}<|start_header_id|>assistant"
                         "<|end_header_id|>\n\n{% endif %}")
    msgs = EXPECTED["prompts"]["mmlu/mmlu_gen_a484b3.py"][0]["messages"]
    lm = DiffusionLM(loaded, chat_by_lm_eval=True, chat_add_special_tokens=True)
    text = lm.apply_chat_template(msgs, add_generation_prompt=True)
    assert text == tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert lm._prompt_ids(text) == tok([text], padding=True)["input_ids"][0]
    assert lm.chat_template(True) == tok.chat_template and lm.chat_template(False) is None
    plain = DiffusionLM(loaded, chat_by_lm_eval=True)
    assert plain._prompt_ids(text) == tok(text, add_special_tokens=False)["input_ids"]


LLADA_CHAT = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
              "<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
              "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
              "{% endif %}")


@pytest.mark.parametrize("column", ["gsm8k_cot", "humaneval"])
def test_paper_settings_run_the_recipe_end_to_end(column, offline_data_dir, repo_root, tmp_path,
                                                  monkeypatch):
    """config/paper.yaml's LLaDA-Instruct settings of a column (shortened window, 2 documents)
    run through ``evaluate``: lm-eval renders the OpenCompass turns with the model's chat
    template, the model tokenizes them with the special prefix, decodes with the EOS option
    and returns the whole window; the recipe's metric is reported."""
    import yaml

    from fair_calib.evaluate import lm as lm_mod
    from fair_calib.evaluate.run import evaluate
    from fair_calib.evaluate.task_settings import resolve_task
    from fair_calib.models.adapters import load_model
    from fixtures.hub_checkpoints import llada_checkpoint

    llada_checkpoint(tmp_path / "m")
    # LLaDA's released context (the toy's is 128): the 4-shot GSM8K turns are never cut
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, "max_sequence_length": 4096}))
    tok = load_model(tmp_path / "m", "llada").tokenizer
    tok.chat_template = LLADA_CHAT
    tok.save_pretrained(tmp_path / "m")
    cfg = yaml.safe_load((repo_root / "config" / "paper.yaml").read_text())
    task = resolve_task(column, cfg["tasks"][column], "llada-8b-instruct", "llada")
    assert task["lm_eval_task"] in offline_data.OC_TASKS and task["whole_window"]
    task.update(limit=2, offline=True, gen_length=4, steps=4, block_length=4)
    seen = []
    real = lm_mod.DiffusionLM._prompt_ids
    monkeypatch.setattr(lm_mod.DiffusionLM, "_prompt_ids",
                        lambda self, ctx: seen.append((ctx, self.policy())) or real(self, ctx))
    settings = {"seed": 0, "device": "cpu", "dtype": "float32", "data_dir": str(offline_data_dir),
                "model": {"name": "llada-8b-instruct", "family": "llada", "instruct": True},
                "method": {"name": "fp", "type": "fp"}, "bits": {"name": "w16a16"}, "task": task}
    df = evaluate(settings, tmp_path / "m", None, tmp_path / "out.parquet")
    assert list(df["n"]) == [2]
    assert list(df["metric"]) == (["acc,none"] if column == "gsm8k_cot" else ["pass@1,create_test"])
    ctx, policy = seen[0]
    assert ctx.startswith((tok.bos_token or "") + "<|start_header_id|>user<|end_header_id|>\n\n")
    assert ctx.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    if column == "gsm8k_cot":
        assert ctx.count("<|start_header_id|>assistant") == 5      # 4 worked examples + the turn
        assert policy.confidence_eos_eot_inf and not policy.logits_eos_inf
    else:
        assert "Complete the following python code:\n" in ctx
        assert policy.logits_eos_inf and not policy.confidence_eos_eot_inf


def test_mmlu_is_the_plain_mean_over_subjects():
    """OpenCompass's summarizer reports `mmlu` as the unweighted mean of the subject scores
    (`mmlu-weighted` is the other); ``mean_over: subtasks`` computes it from per-doc values."""
    from fair_calib.evaluate.run import summarize
    per_doc = {"metrics": {"acc,none": {"oc_mmlu_gen_a": {"0": 1.0},
                                        "oc_mmlu_gen_b": {"0": 0.0, "1": 0.0, "2": 1.0}}},
               "chance": {}}
    row, = summarize(per_doc, "subtasks")
    assert row["value"] == pytest.approx((1.0 + 1 / 3) / 2) and row["n"] == 4
    row_docs, = summarize(per_doc)
    assert row_docs["value"] == pytest.approx(2 / 4)                   # the document mean
    with pytest.raises(ValueError, match="mean_over"):
        summarize(per_doc, "subjects")


def test_arc_dev_split_offline_is_refused_by_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="ARC-Challenge-Dev.jsonl.*data_source: hub"):
        offline_data.write_oc_tasks(tmp_path / "t", ["oc_arc_c_gen"], True, tmp_path, tmp_path / "c")


def test_hub_mode_renders_the_hub_datasets(tmp_path):
    import yaml
    offline_data.write_oc_tasks(tmp_path, ["oc_arc_c_gen", "oc_gsm8k_gen"], False, None, tmp_path)
    text = (tmp_path / "oc_arc_c_gen.yaml").read_text()
    assert "dataset_path: \"allenai/ai2_arc\"" in text and "test_split: \"validation\"" in text
    assert "dataset_name: \"main\"" in (tmp_path / "oc_gsm8k_gen.yaml").read_text()
    assert yaml.safe_load(text.replace("!function ", ""))["dataset_name"] == "ARC-Challenge"


# The LLaDA authors' example configs (ML-GSAI/LLaDA opencompass/examples/*.py, eval_cfg) for the
# Instruct models: (gen_length, gen_steps, gen_blocksize, diff_confidence_eos_eot_inf,
# diff_logits_eos_inf, dataset config).
LLADA_EXAMPLES = {
    ("llada-8b-instruct", "arc_challenge"): (512, 512, 512, False, False, "oc_arc_c_gen"),
    ("llada-8b-instruct", "hellaswag"): (3, 3, 3, False, False, "oc_hellaswag_gen"),
    ("llada-8b-instruct", "mmlu"): (3, 3, 3, False, False, "oc_mmlu_gen"),
    ("llada-8b-instruct", "gsm8k_cot"): (512, 512, 512, True, False, "oc_gsm8k_gen"),
    ("llada-8b-instruct", "humaneval"): (512, 512, 512, False, True, "oc_humaneval_gen"),
    ("llada-1.5", "gsm8k_cot"): (256, 256, 16, True, False, "oc_gsm8k_gen"),
    ("llada-1.5", "humaneval"): (512, 512, 32, True, False, "oc_humaneval_gen"),
}


@pytest.mark.parametrize("model,column", sorted(LLADA_EXAMPLES))
def test_paper_yaml_resolves_to_the_llada_recipe(model, column, repo_root):
    import yaml

    from fair_calib.evaluate.task_settings import resolve_task
    cfg = yaml.safe_load((repo_root / "config" / "paper.yaml").read_text())
    t = resolve_task(column, cfg["tasks"][column], model, "llada")
    length, steps, block, conf_inf, logits_inf, task = LLADA_EXAMPLES[(model, column)]
    dec = t.get("decoding") or {}
    assert (t["gen_length"], t["steps"], t["block_length"]) == (length, steps, block)
    assert (bool(dec.get("confidence_eos_eot_inf")), bool(dec.get("logits_eos_inf"))) == \
        (conf_inf, logits_inf)
    assert t["lm_eval_task"] == task and dec.get("temperature", 0.0) == 0.0   # LLaDAModel: 0.
    assert t["apply_chat_template"] and t["fewshot_as_multiturn"] and t["whole_window"]
    assert t["chat_add_special_tokens"] and t["batch_size"] == 1
    assert t.get("cfg_scale", 0.0) == 0.0 and "policy" not in dec          # low_confidence, cfg 0
    few = {"oc_mmlu_gen": 5, "oc_gsm8k_gen": 4}.get(task, 0)
    assert t["num_fewshot"] == few
    assert t.get("mean_over") == ("subtasks" if task == "oc_mmlu_gen" else None)


def test_the_base_settings_are_one_setting_away(repo_root):
    """``instruct_recipes: false``: the Instruct models run their family's (Base) settings."""
    import yaml

    from fair_calib.evaluate.offline_data import OFFLINE_TASKS, RECIPE_TASKS
    from fair_calib.evaluate.task_settings import resolve_task, use_by_model
    cfg = yaml.safe_load((repo_root / "config" / "paper.yaml").read_text())
    assert use_by_model(cfg) and not use_by_model({**cfg, "instruct_recipes": False})
    for column in cfg["tables"]["main"]["tasks"]:
        entry = cfg["tasks"][column]
        for model in ("llada-8b-instruct", "llada-1.5", "dream-7b-instruct"):
            family = cfg["models"][model]["family"]
            base = "llada-8b-base" if family == "llada" else "dream-7b-base"
            assert resolve_task(column, entry, model, family, by_model=False) == \
                resolve_task(column, entry, base, family)
            recipe = resolve_task(column, entry, model, family)
            name = recipe.get("lm_eval_task", column)
            assert name in OFFLINE_TASKS or name in RECIPE_TASKS      # the census counts it
