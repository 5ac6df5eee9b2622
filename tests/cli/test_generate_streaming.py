"""`fair-calib generate` prints each completion as it finishes (``--jsonl`` too, with the
prompt's index), and its interrupt line says what was printed and what was not generated."""
from __future__ import annotations

import json

import pytest
from lm_eval.api.instance import Instance

from fair_calib.cli import main as cli, generate_cli
from fair_calib.evaluate.lm import DiffusionLM

PROMPTS = ["w5 w6 w7", "w9", "w3 w4"]
SMALL = ["--gen-length", "16", "--steps", "16"]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    from fixtures.hub_checkpoints import llada_checkpoint

    folder = tmp_path_factory.mktemp("stream") / "llada"
    llada_checkpoint(folder)
    return folder


def test_each_completion_is_handed_over_as_it_finishes(toy):
    lm = DiffusionLM.create_from_arg_string(f"pretrained={toy},gen_length=16,steps=16,"
                                            "gen_batch_size=1", {"device": "cpu"})
    seen = []
    out = generate_cli.generate(lm, PROMPTS, [], on_result=lambda i, t: seen.append((i, t)))
    assert sorted(seen) == list(enumerate(out)) and len(seen) == len(PROMPTS)
    assert lm.on_generated is None
    ref = lm.generate_until([Instance("generate_until", {}, (p, {"until": []}), i)
                             for i, p in enumerate(PROMPTS)])
    assert ref == out


class _Interrupted:
    """A model that finishes one completion, then is stopped by Ctrl-C."""
    on_generated = None

    def generate_until(self, requests):
        self.on_generated(1, "first done")
        raise KeyboardInterrupt


@pytest.mark.parametrize("jsonl", [False, True])
def test_a_ctrl_c_keeps_what_was_printed_and_says_so(toy, monkeypatch, capsys, jsonl):
    monkeypatch.setattr(generate_cli, "load_lm", lambda *a, **k: _Interrupted())
    monkeypatch.setattr(generate_cli, "report_cut_prompts", lambda *a: None)
    argv = [str(toy), *sum((["--prompt", p] for p in PROMPTS), []), *SMALL] + (["--jsonl"] * jsonl)
    with pytest.raises(KeyboardInterrupt):
        generate_cli.run_cli(argv)
    out = capsys.readouterr().out
    if jsonl:
        assert json.loads(out) == {"index": 1, "prompt": "w9", "completion": "first done"}
    else:
        assert out == "=== 2/3: w9\nfirst done\n"
    line = cli._interrupted("generate", "Ctrl-C")
    assert line == ("fair-calib generate: interrupted (Ctrl-C) after 1 of 3 completions, printed "
                    "above as each finished; the other 2 were not generated (rerun with those "
                    "prompts)")
    assert "calibration" not in line


def test_other_commands_interrupt_lines_fit_them():
    line = cli._interrupted("compare-runs", "Ctrl-C")
    assert line == "fair-calib compare-runs: interrupted (Ctrl-C); rerun the command to redo it"
    assert "calibration" in cli._interrupted("calibrate", "SIGTERM")
