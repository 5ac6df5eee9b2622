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
                      ("oc_gsm8k_gen", "gsm8k"), ("oc_humaneval_gen", "humaneval")):
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
    ("oc_humaneval_gen", "humaneval/humaneval_gen_8e312c.py", "task_id")])
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
