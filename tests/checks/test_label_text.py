"""Label rules as a table prints them (fair_calib/checks/label_text.py): the 40-character limit counts
what a table column prints (latex_label included, a combining accent as nothing), holds only
for entries a table prints, and a table key its kind prints nowhere is refused."""
from __future__ import annotations

from pathlib import Path


from fair_calib.checks.label_text import printed_length, text_problem

from fixtures.check_config import check_config, one_error_line

REPO = Path(__file__).resolve().parents[2]


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
