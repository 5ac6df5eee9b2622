"""`fair-calib compare-runs` and `fair-calib jobs`: every case one line, nothing computed lost."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fair_calib.report import compare as C

REPO = Path(__file__).resolve().parents[1]


def _cell(run: Path, cell: str) -> None:
    task_dir = run / "results" / "eval" / cell
    task_dir.mkdir(parents=True)
    task_dir.with_suffix(".parquet").write_bytes(b"")
    (task_dir / "shard-0.json").write_text(json.dumps({"per_doc": {
        "metrics": {"acc,none": {"t": {"0": 1.0}}}, "responses": {"t": {"none": {"0": ["x"]}}},
        "execution": {"arithmetic": "fake", "line": ""}}}))


def test_two_runs_without_a_cell_in_common_are_one_error_line(tmp_path, capsys):
    _cell(tmp_path / "a", "m/fp/fp/gen")
    _cell(tmp_path / "b", "other/fp/fp/gen")
    with pytest.raises(SystemExit) as err:
        C.run_cli([str(tmp_path / "a"), str(tmp_path / "b")])
    msg = str(err.value)
    assert msg.startswith("error: fair-calib compare-runs: ") and "\n" not in msg
    assert "hold no evaluation of the same model, method, bits and task" in msg
    assert "e.g. m/fp/fp/gen" in msg and "e.g. other/fp/fp/gen" in msg
    assert capsys.readouterr().out == ""          # no empty table


def test_json_into_a_missing_folder_is_refused_before_any_work(tmp_path):
    _cell(tmp_path / "a", "m/fp/fp/gen")
    _cell(tmp_path / "b", "m/fp/fp/gen")
    out = tmp_path / "no/such/rows.json"
    with pytest.raises(SystemExit, match=r"--json .*rows.json: the folder .*no/such does not "
                                         r"exist; create it or name another file"):
        C.run_cli([str(tmp_path / "a"), str(tmp_path / "b"), "--json", str(out)])
    C.run_cli([str(tmp_path / "a"), str(tmp_path / "b"), "--json", str(tmp_path / "rows.json")])
    assert json.loads((tmp_path / "rows.json").read_text())[0]["model"] == "m"


@pytest.mark.parametrize("command", ["compare-runs", "jobs"])
def test_help_texts_are_whole_sentences(command):
    res = subprocess.run([sys.executable, "-m", "fair_calib.cli", command, "--help"], cwd=REPO,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    # the description: the paragraph between the usage and the arguments
    desc = " ".join(res.stdout.split("\n\n")[1].split())
    assert desc.endswith(".") and len(desc) > 60 and "``" not in desc, desc
