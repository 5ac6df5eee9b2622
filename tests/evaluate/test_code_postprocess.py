"""Dream's HumanEval handling (DreamLM/Dream eval/eval_dream_gen.sh): ``escape_until=true`` and
``postprocess_code.py`` (with ``sanitize.py``) before pass@1, on hand-written completions."""
from __future__ import annotations

import ast
import importlib.util

import pytest

from fair_calib.evaluate import code_postprocess as cp
from fair_calib.evaluate import offline_data as od


# ---- the authors' formulas, written out step by step (no pruning, their loop order) --------
def ref_sanitize(text, entrypoint):
    text = text.replace("\t", "    ")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = text.strip() + "\n"
    lines = text.splitlines()
    if len(lines) > 100:
        lines = lines[:100]
    best_n, best = 0, ""
    for i in range(len(lines)):
        for j in range(i, len(lines)):
            snippet = "\n".join(lines[i:j + 1])
            try:
                ast.parse(snippet)
            except SyntaxError:
                continue
            n = sum(1 for line in lines[i:j + 1] if line.strip())
            if n > best_n:
                best_n, best = n, snippet
    tree = ast.parse(best)
    imports, defs = [], {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(node)
        elif isinstance(node, ast.ClassDef):
            defs[node.name] = node
        elif isinstance(node, ast.FunctionDef):
            if any(isinstance(n, ast.Return) for n in ast.walk(node)):
                defs[node.name] = node
        elif isinstance(node, ast.Assign):
            if node.targets and isinstance(node.targets[0], ast.Name):
                defs[node.targets[0].id] = node
    deps = {}
    for name, node in defs.items():
        found, stack = set(), [node]
        while stack:
            for child in ast.iter_child_nodes(stack.pop()):
                if isinstance(child, ast.Name):
                    found.add(child.id)
                elif isinstance(child, ast.Attribute):
                    found.add(child.attr)
                else:
                    stack.append(child)
        deps[name] = found
    visited, queue = set(), [entrypoint]
    while queue:
        cur = queue.pop(0)
        if cur not in visited:
            visited.add(cur)
            queue.extend(deps.get(cur, set()) - visited)
    out = [ast.unparse(n) for n in imports]
    out += [ast.unparse(n) for name, n in defs.items() if name in visited]
    return "\n".join(out)


def ref_program(prompt, completion, entry_point):
    """postprocess_code.py: the ```python block (if any) after the prompt, then sanitize."""
    return ref_sanitize(prompt + "\n" + completion.split("```python\n", 1)[-1].split("```")[0],
                        entry_point)


PROMPT = 'import math\n\n\ndef area(r: float) -> float:\n    """Area of a circle."""\n'
COMPLETIONS = [
    # body only, then prose and a top-level print (lm-eval's stop strings would cut at "\nprint")
    "    return math.pi * r * r\n\nprint(area(1))\nThis computes the area.",
    # a fenced answer that restates the function, with a helper it calls and one it does not
    "Here is the code:\n```python\nimport math\n\ndef sq(x):\n\treturn x * x\n\n"
    "def area(r):\n    return math.pi * sq(r)\n\ndef unused():\n    return 0\n```\nDone.",
    # a helper without return (dropped), a constant used through an attribute-free name
    "    return SCALE * math.pi * r ** 2\n\nSCALE = 1\ndef noop():\n    pass\n",
    # broken code after the body: only the longest parsable run survives
    "    return math.pi * r * r\n\n    def (((\n",
    # nothing parsable at all
    "))) ((( :::",
    # CRLF line ends and a class the function uses through an attribute
    "    return Geometry.factor * r * r\r\n\r\nclass Geometry:\r\n    factor = math.pi\r\n",
]


@pytest.mark.parametrize("completion", COMPLETIONS)
def test_program_is_the_authors_postprocess(completion):
    assert cp.dream_program(PROMPT, completion, "area") == ref_program(PROMPT, completion, "area")


def test_hand_checked_programs():
    got = cp.dream_program(PROMPT, COMPLETIONS[0], "area")
    assert got == ("import math\ndef area(r: float) -> float:\n    \"\"\"Area of a circle.\"\"\"\n"
                   "    return math.pi * r * r")
    got = cp.dream_program(PROMPT, COMPLETIONS[1], "area")
    # the fenced block only: prompt's signature is redefined by the block, helper kept, unused dropped
    assert "def sq(x):\n    return x * x" in got and "unused" not in got and "Here is" not in got
    got = cp.dream_program(PROMPT, COMPLETIONS[2], "area")
    assert got.endswith("SCALE = 1") and "noop" not in got
    # nothing parses after the prompt, whose function has no return yet: the import alone
    assert cp.dream_program(PROMPT, COMPLETIONS[4], "area") == "import math"


def test_longest_run_ties_keep_the_first_and_cap_at_100_lines():
    text = "x = (\n" + "a = 1\n" * 3 + "(((\n" + "b = 2\n" * 3
    assert cp.longest_valid_code(text) == "a = 1\na = 1\na = 1"
    long = "".join(f"v{i} = {i}\n" for i in range(150))
    assert cp.longest_valid_code(long).count("\n") == 99


@pytest.fixture
def fc_utils():
    spec = importlib.util.spec_from_file_location("fc_task_utils", od.TEMPLATE_DIR / "fc_task_utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    return utils


def test_pass_at_1_on_hand_written_completions(fc_utils, monkeypatch):
    """The program pass@1 runs is the post-processed one: prose and a print after a correct
    body pass; with lm-eval's own predictions (prompt + raw text, no stop strings) they fail."""
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    doc = {"prompt": PROMPT, "entry_point": "area",
           "test": "def check(f):\n    assert abs(f(2) - 4 * 3.141592653589793) < 1e-9\n"}
    ref = doc["test"] + f"\ncheck({doc['entry_point']})"
    ours = cp.dream_build_predictions([[COMPLETIONS[0]], [COMPLETIONS[1]]], [doc, doc])
    assert fc_utils.pass_at_k([ref, ref], ours) == {"pass@1": 1.0}
    raw = fc_utils.build_predictions([[COMPLETIONS[0]]], [doc])
    assert fc_utils.pass_at_k([ref], raw) == {"pass@1": 0.0}


def test_escape_until_is_dreams_text_rule():
    """eval.py: decode(window).split(eos_token)[0], the task's stop strings not applied."""
    from fair_calib.evaluate.lm import DiffusionLM

    from tiny_eval_helpers import make_loaded

    loaded = make_loaded("tiny-dream")
    tok = loaded.tokenizer
    ids = tok("what is the colour . Answer sky #### red")["input_ids"] + [loaded.eos_id] + \
        tok("blue")["input_ids"] + [loaded.pad_id]
    until = [" Answer", "####"]
    lm = DiffusionLM(loaded, escape_until=True)
    got = lm.postprocess(ids, until)
    assert got == tok.decode(ids).split(tok.eos_token)[0]
    assert "Answer sky #### red" in got and "blue" not in got
    assert DiffusionLM(loaded).postprocess(ids, until) == "what is the colour."   # stop strings


def test_humaneval_task_gets_the_authors_filter(offline_data_dir, tmp_path):
    from lm_eval.tasks import TaskManager

    from fair_calib.evaluate.run import use_code_postprocess

    inc = od.write_offline_tasks(offline_data_dir, tmp_path / "cache", tmp_path / "tasks",
                                 ["humaneval"])
    tasks = TaskManager(include_path=str(inc), include_defaults=False).load(["humaneval"])["tasks"]
    use_code_postprocess(tasks, "dream")
    task = tasks["humaneval"]
    (ensemble,) = task._filters
    assert ensemble.name == "create_test"                     # the metric key stays pass@1,create_test
    doc = task.eval_docs[0]
    resp = doc["canonical_solution"].strip("\n") + "\n\nprint('done')\nExplanation follows."
    (f,) = ensemble.filters
    assert f().apply([[resp]], [doc]) == [[ref_program(doc["prompt"], resp, doc["entry_point"])]]
    with pytest.raises(ValueError, match="code_postprocess = 'x'"):
        use_code_postprocess(tasks, "x")
