"""Dream-Instruct as DreamLM/Dream ``eval_instruct`` scores it (its lm-eval fork and eval.sh).

``fixtures/dream/eval_instruct.json`` holds what the fork's files say (read from the repository
at the commit it names: eval.sh's runs, the task YAMLs' fields, diffllm's prompt cap). The
tests check that config/paper.yaml resolves to those runs, that the project's task YAMLs carry
those fields, that lm-eval renders the chat turns the fork's ``fewshot_context`` builds (its
logic written out below), and that the model class cuts text as the fork's ``diffllm`` does.
"""
import json
import shutil
from pathlib import Path

import pytest
import yaml

from fair_calib.evaluate import offline_data
from fair_calib.evaluate.task_settings import resolve_task

FORK = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "dream" /
                   "eval_instruct.json").read_text())
TASKS = offline_data.TEMPLATE_DIR


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!function", lambda loader, node: "!function " + loader.construct_scalar(node))


def _yaml(name):
    """A task template rendered over placeholder dataset lines."""
    if name.startswith("dream_mmlu"):
        text = offline_data.dream_mmlu_subject_yaml("anatomy", {
            "DATASET_PATH": "x", "DATASET_NAME": None, "DATASET_KWARGS": None})
    else:
        text = offline_data._render((TASKS / name).read_text(), offline_data._local_json("x"))
    return yaml.load(text, _Loader)


@pytest.mark.parametrize("column,run", [("mmlu", "mmlu_generative"), ("gsm8k_cot", "gsm8k_cot"),
                                        ("humaneval", "humaneval_instruct")])
def test_paper_yaml_resolves_to_eval_sh(column, run, repo_root):
    cfg = yaml.safe_load((repo_root / "config" / "paper.yaml").read_text())
    t = resolve_task(column, cfg["tasks"][column], "dream-7b-instruct", "dream")
    want = FORK["eval_sh"][run]
    args = want["model_args"]
    assert (t["gen_length"], t["steps"]) == (int(args["max_new_tokens"]), int(args["diffusion_steps"]))
    dec = t["decoding"]
    assert (dec["temperature"], dec["top_p"]) == (float(args["temperature"]), float(args["top_p"]))
    assert "top_k" not in dec and dec.get("policy", "entropy") == args["alg"].strip('"')
    assert t["num_fewshot"] == want["num_fewshot"] and t["batch_size"] == want["batch_size"]
    assert t["apply_chat_template"] == want["apply_chat_template"]
    assert t["fewshot_as_multiturn"] == want["fewshot_as_multiturn"]
    assert t["max_prompt_len"] == FORK["diffllm_max_prompt_len_default"]
    assert t["eos_split_until"] and not t.get("escape_until") and not t["add_bos_token"]
    task = {"mmlu": "dream_mmlu_generative", "humaneval": "dream_humaneval_instruct",
            "gsm8k_cot": "gsm8k_cot"}[column]
    assert t["lm_eval_task"] == task
    if column == "humaneval":
        assert t["code_postprocess"] == "dream"


def test_task_yamls_carry_the_fork_fields():
    he = _yaml("dream_humaneval_instruct.yaml")
    fork = FORK["humaneval_instruct"]
    assert (he["doc_to_text"], he["gen_prefix"]) == (fork["doc_to_text"], fork["gen_prefix"])
    assert he["generation_kwargs"]["until"] == fork["until"]
    assert he["doc_to_target"] == fork["doc_to_target"]
    mm = _yaml("dream_mmlu_generative_subject.yaml")
    fork = FORK["mmlu_generative"]
    for key in ("doc_to_text", "doc_to_target", "generation_kwargs", "metric_list", "filter_list",
                "fewshot_config", "fewshot_split", "test_split"):
        assert mm[key] == fork[key], key
    ex = FORK["mmlu_generative_subject_example"]
    rendered = yaml.load(offline_data.dream_mmlu_subject_yaml(
        ex["dataset_name"], {"DATASET_PATH": "x", "DATASET_NAME": ex["dataset_name"],
                             "DATASET_KWARGS": None}), _Loader)
    assert rendered["description"] == ex["description"]
    # the fork's gsm8k_cot is lm-eval 0.4.13's own (prompt, target, stops, filters)
    import lm_eval.tasks
    own = yaml.load((Path(lm_eval.tasks.__file__).parent / "gsm8k" / "gsm8k-cot.yaml").read_text(),
                    _Loader)
    for key, val in FORK["gsm8k_cot_fork_vs_lm_eval"].items():
        assert own[key] == val, key


def test_the_instruct_filter_is_build_predictions_instruct():
    """The fork's ``build_predictions_instruct``: sanitize(prompt + "\\n" + the response's text
    after its first ```python fence up to the next fence, entry point): what code_postprocess
    dream computes (the fork's sanitize_utils is eval/sanitize.py)."""
    from fair_calib.evaluate.code_postprocess import dream_build_predictions, sanitize
    doc = {"prompt": "def f(x):\n    \"\"\"twice\"\"\"\n", "entry_point": "f"}
    for r in ["    return 2 * x\n```\nDone.", "Sure:\n```python\ndef f(x):\n    return x + x\n```",
              "    return 2 * x\n<|im_end|>"]:
        want = sanitize(doc["prompt"] + "\n" + r.split('```python\n', 1)[-1].split('```')[0], "f")
        assert dream_build_predictions([[r]], [doc]) == [[want]]


def _fork_messages(description, fewshot, question, gen_prefix, target_delimiter=" ",
                   fewshot_delimiter="\n\n"):
    """The fork's ``fewshot_context`` with a chat template and ``fewshot_as_multiturn`` off:
    system = description; the examples as one user turn (``get_context``: text + target
    delimiter + target + few-shot delimiter each), the question appended to it; gen_prefix as
    an assistant turn."""
    msgs = [{"role": "system", "content": description}] if description else []
    if fewshot:
        msgs.append({"role": "user", "content": "".join(
            q + target_delimiter + a + fewshot_delimiter for q, a in fewshot)})
        msgs[-1]["content"] += question
    else:
        msgs.append({"role": "user", "content": question})
    if gen_prefix:
        msgs.append({"role": "assistant", "content": gen_prefix})
    return msgs


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _requests(tm, name, shots):
    task = tm.load([name])["tasks"][name]
    task.set_fewshot_seed(1234)
    task.set_config(key="num_fewshot", value=shots)          # as simple_evaluate does
    task.build_all_requests(rank=0, world_size=1, apply_chat_template=True,
                            fewshot_as_multiturn=False,
                            chat_template=lambda m, add_generation_prompt=True: json.dumps(
                                [m, add_generation_prompt]),
                            tokenizer_name="recorder")
    return sorted(task.instances, key=lambda i: i.doc_id)


def test_lm_eval_renders_the_fork_turns(tmp_path):
    from lm_eval.tasks import TaskManager
    inc = tmp_path / "t"
    inc.mkdir()
    shutil.copy(TASKS / "fc_task_utils.py", inc / "fc_task_utils.py")
    dev = [{"question": f"Q{i}?", "subject": "anatomy", "choices": ["a", "b", "c", "d"],
            "answer": i % 4} for i in range(6)]
    test = [{"question": " Which bone? ", "subject": "anatomy",
             "choices": ["femur", "ulna", "skull", "rib"], "answer": 2}]
    files = {"test": _jsonl(tmp_path / "t.jsonl", test), "dev": _jsonl(tmp_path / "d.jsonl", dev)}
    (inc / "m.yaml").write_text(offline_data.dream_mmlu_subject_yaml(
        "anatomy", {"DATASET_PATH": "json", "DATASET_NAME": None,
                    "DATASET_KWARGS": {"data_files": files}}))
    he = [{"task_id": "T/0", "prompt": "def f(x):\n", "entry_point": "f", "canonical_solution": "",
           "test": "def check(c):\n    pass\n"}]
    (inc / "h.yaml").write_text(offline_data._render(
        (TASKS / "dream_humaneval_instruct.yaml").read_text(),
        offline_data._local_json(_jsonl(tmp_path / "h.jsonl", he))))
    tm = TaskManager(include_path=str(inc), include_defaults=False)

    inst, = _requests(tm, "dream_mmlu_generative_anatomy", 4)
    opts = lambda d: "\n".join(f"{l}. {c}" for l, c in zip("ABCD", d["choices"]))  # noqa: E731
    text = lambda d: f"{d['question'].strip()}\n{opts(d)}\nAnswer:"                 # noqa: E731
    want = _fork_messages("The following are multiple choice questions (with answers) about "
                          "anatomy.\n\n", [(text(d), "ABCD"[d["answer"]]) for d in dev[:4]],
                          text(test[0]), None)
    assert json.loads(inst.args[0]) == [want, True]
    assert inst.args[1]["until"] == FORK["mmlu_generative"]["generation_kwargs"]["until"]

    inst, = _requests(tm, "dream_humaneval_instruct", 0)
    fork = FORK["humaneval_instruct"]
    want = _fork_messages("", [], fork["doc_to_text"].replace("{{prompt}}", he[0]["prompt"]),
                          fork["gen_prefix"].replace("{{prompt}}", he[0]["prompt"]))
    assert json.loads(inst.args[0]) == [want, False]          # the assistant turn is continued


# Qwen2's chat template (Dream-Instruct's tokenizer has Qwen's): each turn's content verbatim
QWEN_CHAT = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
             "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
             "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
             "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
HE_DOC = {"task_id": "HumanEval/0", "entry_point": "has_close_elements", "canonical_solution": "",
          "test": "def check(candidate):\n    pass\n",
          "prompt": "from typing import List\n\n\ndef has_close_elements(numbers: List[float], "
                    "threshold: float) -> bool:\n    \"\"\" Check if in given list of numbers, are "
                    "any two numbers closer to each other than\n    given threshold.\n    "
                    "\"\"\"\n"}


def transformers_4_46_2_continued(rendered: str, chat: list) -> str:
    """transformers 4.46.2 ``apply_chat_template(..., continue_final_message=True)``: after
    rendering, ``final_message = chat[-1]["content"].strip()`` and ``rendered_chat =
    rendered_chat[: rendered_chat.rindex(final_message) + len(final_message)].rstrip()``."""
    final_message = chat[-1]["content"]
    final_message = final_message.strip()
    return rendered[: rendered.rindex(final_message) + len(final_message)].rstrip()


def test_dream_humaneval_prompt_is_rendered_as_transformers_4_46_2(tmp_path):
    """Dream's README pins transformers 4.46.2, whose continue_final_message cuts the
    gen_prefix turn at its stripped end: the prompt ends with the docstring's closing quotes,
    not with the newlines after them, whatever transformers renders here."""
    from lm_eval.tasks import TaskManager

    from fair_calib.evaluate.lm import DiffusionLM
    from tiny_eval_helpers import make_loaded

    loaded = make_loaded("tiny-dream")
    loaded.tokenizer.chat_template = QWEN_CHAT
    lm = DiffusionLM(loaded, chat_by_lm_eval=True, chat_add_special_tokens=True)
    inc = tmp_path / "t"
    inc.mkdir()
    shutil.copy(TASKS / "fc_task_utils.py", inc / "fc_task_utils.py")
    (inc / "h.yaml").write_text(offline_data._render(
        (TASKS / "dream_humaneval_instruct.yaml").read_text(),
        offline_data._local_json(_jsonl(tmp_path / "h.jsonl", [HE_DOC]))))
    task = TaskManager(include_path=str(inc), include_defaults=False).load(
        ["dream_humaneval_instruct"])["tasks"]["dream_humaneval_instruct"]
    task.set_fewshot_seed(1234)
    task.build_all_requests(rank=0, world_size=1, apply_chat_template=True,
                            fewshot_as_multiturn=False, chat_template=lm.apply_chat_template,
                            tokenizer_name="dream")
    (inst,) = task.instances
    fork = FORK["humaneval_instruct"]
    chat = _fork_messages("", [], fork["doc_to_text"].replace("{{prompt}}", HE_DOC["prompt"]),
                          fork["gen_prefix"].replace("{{prompt}}", HE_DOC["prompt"]))
    closed = loaded.tokenizer.apply_chat_template(chat, tokenize=False)
    assert inst.args[0] == transformers_4_46_2_continued(closed, chat)
    assert inst.args[0].endswith('threshold.\n    """')
    assert inst.args[0].startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                                   "<|im_start|>user\nWrite a solution")


class _Tok:
    """Decodes ids 0..9 to letters, 7 to the EOS text, 8 to a special token."""
    eos_token = "<|endoftext|>"
    eos_token_id = 7

    def decode(self, ids, skip_special_tokens=False):
        table = {7: self.eos_token, 8: "<|im_end|>"}
        out = "".join(table.get(i, "abcdefghij"[i]) for i in ids)
        return out.replace("<|im_end|>", "").replace(self.eos_token, "") if skip_special_tokens \
            else out


def test_diffllm_text_rule():
    """diffllm: decode(window) (special tokens kept) split at the EOS text, then r.split(s)[0]
    for each stop string in turn."""
    from fair_calib.evaluate.lm import DiffusionLM
    lm = DiffusionLM.__new__(DiffusionLM)
    lm.tokenizer, lm.whole_window, lm.escape_until, lm.eos_split_until = _Tok(), False, False, True
    ids = [0, 1, 8, 2, 7, 3, 4]                     # "ab<|im_end|>c" then EOS, "de"
    assert lm.postprocess(ids, []) == "ab<|im_end|>c"
    assert lm.postprocess(ids, ["<|im_end|>"]) == "ab"
    assert lm.postprocess(ids, ["b", "a"]) == ""
    lm.eos_split_until, lm.whole_window = False, True  # OpenCompass: the whole window, no specials
    assert lm.postprocess(ids, ["b"]) == "abcde"
