"""Label rules as a table prints them (fair_calib/checks/label_text.py): the 40-character limit counts
what a table column prints (latex_label included, a combining accent as nothing), holds only
for entries a table prints, a table key its kind prints nowhere is refused, and labels are text a
reader can tell apart (one line, no stray spaces, two tables never share one)."""
from __future__ import annotations

import pytest

from fair_calib.checks.label_text import printed_length, text_problem

from fixtures.check_config import check_config, one_error_line


def test_a_latex_label_is_held_to_the_column_as_printed(tmp_path):
    line = one_error_line(check_config(
        tmp_path, {"methods": {"rtn": {"latex_label": "\\textbf{" + "R" * 45 + "}"}}}))
    assert "methods.rtn.latex_label" in line and "prints 45 characters" in line, line
    assert text_problem("methods.m.latex_label", "\\textbf{" + "x" * 40 + "}", column=True) is None


def test_combining_accents_count_as_printed():
    composed = "e\u0301" * 30                 # 30 visible letters, 60 code points
    assert printed_length(composed) == 30
    assert text_problem("methods.m.label", composed, column=True) is None


def test_a_method_in_no_table_is_not_held_to_a_table_column(tmp_path):
    res = check_config(tmp_path, {"methods": {"spare": {"type": "rtn", "label": "x" * 60}}})
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_header_a_main_table_prints_nowhere_is_refused(tmp_path):
    line = one_error_line(check_config(tmp_path, {"tables": {"main": {"header": "Method"}}}))
    assert "tables.main.header is printed only by tables of kind components, nprobe, " \
           "schedule" in line and "kind main prints it nowhere" in line, line


# the label cases of `fair-calib check-config` (its one error line names the label)
@pytest.mark.parametrize("over, needle", [
    ({"methods": {"flatquant": {"label": "FlatQuant "}}},
     "methods.flatquant.label = 'FlatQuant ' has leading or trailing whitespace"),
    ({"models": {"tiny-llada": {"label": " Tiny-LLaDA"}}},
     "models.tiny-llada.label = ' Tiny-LLaDA' has leading or trailing whitespace"),
    ({"methods": {"rtn": {"label": ""}}}, "methods.rtn.label = '' is empty"),
    ({"methods": {"flatquant": {"label": "Flat  Quant"}}},
     "methods.flatquant.label = 'Flat  Quant' has a run of spaces"),
    ({"tasks": {"synth_mc": {"label": "two\nlines"}}},
     "tasks.synth_mc.label = 'two\\nlines' is not one line"),
    ({"methods": {"fair-calib": {"label": "x" * 461}}},
     "methods.fair-calib.label = 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...' "
     "prints 461 characters; a table column holds at most 40"),
    ({"tables": {"main": {"label": "tab:main"},
                 "other": {"kind": "main", "label": "tab:main", "models": ["tiny-llada"],
                           "methods": ["fp", "rtn"], "bits": "w4a4", "tasks": ["synth_mc"]}}},
     "tables.main.label and tables.other.label are both 'tab:main'"),
    ({"tables": {"main": {"label": "tab:main "}}},
     "tables.main.label = 'tab:main ' has leading or trailing whitespace"),
], ids=["trailing-space", "leading-space", "empty", "double-space", "two-lines", "too-long", "two-tables",
        "table-label-space"])
def test_labels_a_reader_cannot_tell_apart_are_refused(tmp_path, over, needle):
    line = one_error_line(check_config(tmp_path, over))
    assert needle in line, line


def test_a_label_of_40_characters_is_taken():
    from fair_calib.checks.label_text import LABEL_MAX, text_problem

    assert LABEL_MAX == 40
    assert text_problem("methods.m.label", "x" * 40, column=True) is None
    assert text_problem("methods.m.label", "x" * 41, column=True) is not None
    assert text_problem("methods.m.latex_label", "\\textbf{" + "x" * 40 + "}", column=False) is None
