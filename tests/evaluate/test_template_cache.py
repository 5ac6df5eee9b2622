"""The compile-once template path renders exactly what lm-eval's own ``apply_template`` does."""
import pytest
from jinja2.exceptions import UndefinedError
from lm_eval import utils
from lm_eval.api import task as lm_eval_task

from fair_calib.evaluate import template_cache

# templates of the task files we ship (fair_calib/evaluate/tasks/*.yaml), each with a document
CASES = [
    ("Question: {{question}}\nAnswer:", {"question": "Repeat : red Tom blue ."}),
    ("{{answer.split('####')[-1].strip()}}", {"answer": "#### red Tom blue"}),
    ("{{question.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\nC. {{choices[2]}}\n"
     "D. {{choices[3]}}\nAnswer:", {"question": " Why? ", "choices": ["a", "b", "c", "d"]}),
    ("{{['A', 'B', 'C', 'D'][answer]}}", {"answer": 2}),
    ("{% if is_fewshot is defined %}{{code}}\n[DONE]{% else %}{{test_list[0]}}\n{{test_list[1]}}"
     "\n{{test_list[2]}}{% endif %}", {"code": "x = 1", "is_fewshot": True,
                                       "test_list": ["t0", "t1", "t2"]}),
    ("{% if is_fewshot is defined %}{{code}}\n[DONE]{% else %}{{test_list[0]}}\n{{test_list[1]}}"
     "\n{{test_list[2]}}{% endif %}", {"code": "x = 1", "test_list": ["t0", "t1", "t2"]}),
    ("Here is the completed function:\n```python\n{{ prompt }}\n", {"prompt": "def f():"}),
    ("{{ text | regex_replace('[0-9]+', '#') }}", {"text": "a 12 b 3"}),
]


def lm_eval_render(template, doc):
    """lm-eval 0.4.13's ``apply_template``, transcribed: compile, then render."""
    return utils.env.from_string(template).render(**doc)


@pytest.fixture
def installed(monkeypatch):
    monkeypatch.setattr(utils, "apply_template", utils.apply_template)   # undone after the test
    template_cache.install()
    return utils.apply_template


@pytest.mark.parametrize("template,doc", CASES)
def test_renders_what_lm_eval_renders(installed, template, doc):
    assert installed(template, doc) == lm_eval_render(template, doc)
    assert installed(template, doc) == lm_eval_render(template, doc)   # from the compiled cache


def test_compiles_each_template_once(installed):
    installed.compiled.cache_clear()
    for _ in range(3):
        for template, doc in CASES[:2]:
            installed(template, doc)
    info = installed.compiled.cache_info()
    assert (info.misses, info.hits) == (2, 4)


def test_a_missing_field_still_fails_as_in_lm_eval(installed):
    with pytest.raises(UndefinedError):
        lm_eval_render("{{question}}", {})
    with pytest.raises(UndefinedError):
        installed("{{question}}", {})


def test_lm_eval_tasks_render_through_it_and_install_is_idempotent(installed):
    template_cache.install()
    assert utils.apply_template is installed
    assert lm_eval_task.utils.apply_template is installed   # what Task.doc_to_text calls
