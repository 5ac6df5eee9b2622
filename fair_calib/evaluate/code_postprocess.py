"""The Dream authors' HumanEval post-processing, before pass@1 (task ``code_postprocess: dream``).

Dream's base-model HumanEval (DreamLM/Dream ``eval/eval_dream_gen.sh``) generates with
``escape_until=true`` (lm-eval's stop strings are not applied: the completion runs to the first
EOS) and then scores the samples file with ``eval/postprocess_code.py``, which turns each raw
completion into the program it executes:

1. the completion's first ```` ```python ```` block if it has one (the text after the first
   ```` ```python\\n ```` up to the next ```` ``` ````), else the completion itself, is appended to
   the prompt after a newline;
2. ``sanitize`` (``eval/sanitize.py``): tabs become four spaces, line ends ``\\n``, the text is
   stripped; of its first 100 lines, the contiguous run of lines that parses as Python with the
   most non-blank lines is kept (the first such run on ties); of that module only imports,
   classes, functions that contain a ``return`` and assignments to a plain name are kept, and of
   those only the ones the entry point reaches through the names they use (an attribute
   ``a.b`` counts as the name ``b``); imports first, then the definitions in first-definition
   order, each ``ast.unparse``-d, joined by newlines.

pass@1 then runs ``program + "\\n" + test + "\\ncheck(entry_point)"``. The functions below compute
that from the description above (tests: ``tests/evaluate/test_code_postprocess.py``).
"""
from __future__ import annotations

import ast
from typing import Iterable, Sequence

MAX_LINES = 100   # sanitize looks at the first 100 lines only
FENCE_OPEN, FENCE = "```python\n", "```"


def fenced_code(completion: str) -> str:
    """The first ```python block's body, or the completion when it has no such opening."""
    return completion.split(FENCE_OPEN, 1)[-1].split(FENCE)[0]


def normalized(text: str) -> str:
    text = text.replace("\t", "    ").replace("\r\n", "\n").replace("\r", "\n")
    return text.strip() + "\n"


def parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, MemoryError, ValueError):   # ValueError: a NUL byte (Python < 3.12)
        return False
    return True


def longest_valid_code(text: str) -> str:
    """The contiguous run of lines (of the first 100) that parses, with the most non-blank
    lines; the first such run (by start, then end) on ties; "" when none parses."""
    lines = text.splitlines()[:MAX_LINES]
    nonblank = [0]
    for line in lines:
        nonblank.append(nonblank[-1] + bool(line.strip()))
    best_count, best = 0, ""
    for i in range(len(lines)):
        for j in range(i, len(lines)):
            count = nonblank[j + 1] - nonblank[i]
            # only a strictly longer run replaces the best: the rest need not be parsed
            if count > best_count and parses("\n".join(lines[i:j + 1])):
                best_count, best = count, "\n".join(lines[i:j + 1])
    return best


def _kept_definitions(tree: ast.Module) -> tuple[list[ast.stmt], dict[str, ast.stmt]]:
    """Top-level imports, and definitions by name: classes, functions with a return anywhere
    inside, assignments whose first target is a plain name (a later one replaces the node and
    keeps the first one's place)."""
    imports: list[ast.stmt] = []
    defs: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(node)
        elif isinstance(node, ast.ClassDef):
            defs[node.name] = node
        elif isinstance(node, ast.FunctionDef):
            if any(isinstance(n, ast.Return) for n in ast.walk(node)):
                defs[node.name] = node
        elif isinstance(node, ast.Assign) and node.targets and isinstance(node.targets[0], ast.Name):
            defs[node.targets[0].id] = node
    return imports, defs


def used_names(node: ast.AST) -> set[str]:
    """Names a definition uses: every Name's id and every Attribute's attr, not looking inside
    an Attribute's object (``a.b`` gives ``b``)."""
    names: set[str] = set()
    stack = [node]
    while stack:
        for child in ast.iter_child_nodes(stack.pop()):
            if isinstance(child, ast.Name):
                names.add(child.id)
            elif isinstance(child, ast.Attribute):
                names.add(child.attr)
            else:
                stack.append(child)
    return names


def reachable(entry: str, uses: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [entry]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(uses.get(name, set()) - seen)
    return seen


def sanitize(text: str, entry_point: str | None = None) -> str:
    tree = ast.parse(longest_valid_code(normalized(text)))
    imports, defs = _kept_definitions(tree)
    if entry_point:
        keep = reachable(entry_point, {name: used_names(node) for name, node in defs.items()})
        defs = {name: node for name, node in defs.items() if name in keep}
    return "\n".join(ast.unparse(node) for node in [*imports, *defs.values()])


def dream_program(prompt: str, completion: str, entry_point: str) -> str:
    """What ``postprocess_code.py`` executes for one HumanEval sample (before the tests)."""
    return sanitize(prompt + "\n" + fenced_code(completion), entry_point)


def dream_build_predictions(resps: Sequence[Sequence[str]], docs: Iterable[dict]) -> list[list[str]]:
    """lm-eval filter (in place of HumanEval's ``build_predictions``): each response's program."""
    return [[dream_program(doc["prompt"], r, doc["entry_point"]) for r in resp]
            for resp, doc in zip(resps, docs)]


POSTPROCESSORS = {"dream": dream_build_predictions}
