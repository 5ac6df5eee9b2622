"""`fair-calib generate` (issue 42, item 6): a model's completions of the user's prompts, FP and
with a calibration, are the evaluation's own (``DiffusionLM.generate_until`` built as lm-eval
builds it from ``--model_args``), and every bad argument ends in one line naming it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lm_eval.api.instance import Instance

from fair_calib.cli import generate_cli
from fair_calib.evaluate.lm import DiffusionLM

REPO = Path(__file__).resolve().parents[2]
PROMPTS = ["w5 w6 w7", "w9"]
# the toy checkpoints' context is 128 tokens; the llada defaults (256 steps and tokens) do not fit
SMALL = ["--gen-length", "16", "--steps", "16"]
CHAT = ("{% for m in messages %}w2 {{ m['content'] }} <|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %} w1{% endif %}")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A LLaDA checkpoint in the hub's layout (toy sizes, tests/fixtures/hub_checkpoints.py),
    its tokenizer given a chat template, an RTN W4A4 calibration of it recorded as the
    pipeline records one (model_dir, model_content), and a Dream checkpoint."""
    from fixtures.hub_checkpoints import dream_checkpoint, llada_checkpoint
    from transformers import PreTrainedTokenizerFast

    from fair_calib.calibrate import calibrate
    from fair_calib.methods import make_method
    from fair_calib.jobs.model_identity import content_id
    from fair_calib.models.adapters import load_model

    root = tmp_path_factory.mktemp("generate")
    model, other = root / "llada", root / "dream"
    llada_checkpoint(model)
    dream_checkpoint(other)
    tok = PreTrainedTokenizerFast.from_pretrained(model)
    tok.chat_template = CHAT
    tok.save_pretrained(model)
    ids = torch.randint(0, 90, (4, 16), generator=torch.Generator().manual_seed(0))
    run_info = {"model_dir": str(model), "model_content": content_id(model),
                "settings": {"model": {"name": "toy-llada", "family": "llada"}}}
    calibrate(load_model(model, "llada"), make_method({"type": "rtn"}, 4, 4), ids, root / "calib",
              batch_size=4, run_info=run_info, log=lambda *_: None)
    return {"model": model, "calib": root / "calib", "other": other, "root": root}


def _reference(model, calib, prompts, until, extra="", instruct=False):
    """What lm-eval's fair_calib_dlm returns for these requests (``fair-calib lm-eval``'s
    model, built from the same ``--model_args`` string)."""
    args = f"pretrained={model},gen_length=16,steps=16{extra}"
    if calib:
        args += f",calib_dir={calib}"
    if instruct:
        args += ",instruct=true"
    lm = DiffusionLM.create_from_arg_string(args, {"device": "cpu"})
    return lm.generate_until([Instance("generate_until", {}, (p, {"until": list(until)}), i)
                              for i, p in enumerate(prompts)])


def _cli(args):
    """`fair-calib generate` in a process of its own, on this process's kernels (native CPU
    numerics, as many threads), so that its floats are this process's."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
           "FAIR_CALIB_CPU_NUMERICS": "native", "OMP_NUM_THREADS": str(torch.get_num_threads()),
           "FAIR_CALIB_LOWBIT": "auto"}
    return subprocess.run([sys.executable, "-m", "fair_calib.cli", "generate", *args],
                          env=env, capture_output=True, text=True, timeout=300)


def _execution_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines()
            if line.startswith("[fair-calib] low-bit execution:")]


def test_generate_answers_with_a_calibration_as_the_evaluation_decodes(toy):
    """Through `fair-calib generate` itself: argmax decoding, cut at a stop string."""
    argv = [str(toy["model"]), "--calib-dir", str(toy["calib"]), "--prompt", PROMPTS[0],
            "--prompt", PROMPTS[1], *SMALL, "--until", "w30", "--jsonl"]
    proc = _cli(argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    expected = _reference(toy["model"], toy["calib"], PROMPTS, ["w30"])
    assert [r["prompt"] for r in rows] == PROMPTS
    assert [r["completion"] for r in rows] == expected
    assert all(expected) and all("w30" not in text for text in expected)
    # load_quantized's line: on a CPU, fake quantization, and why
    assert _execution_lines(proc.stderr) == [
        "[fair-calib] low-bit execution: 0 of 14 quantized linears on integer codes "
        "(FAIR_CALIB_LOWBIT=auto: device cpu is not CUDA); the others on fake quantization"]
    assert "decoding (llada defaults with the given settings): name=low_confidence, steps=16, " \
           "gen_length=16, block_length=8" in proc.stderr


def test_generate_answers_with_the_fp_model_as_the_evaluation_decodes(toy, capsys):
    """Without a calibration, seeded sampling (in this process: the module the subcommand runs)."""
    generate_cli.run_cli([str(toy["model"]), "--prompt", PROMPTS[0], "--prompt", PROMPTS[1],
                          *SMALL, "--temperature", "0.7", "--seed", "3", "--jsonl"])
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    expected = _reference(toy["model"], None, PROMPTS, [], ",temperature=0.7,seed=3")
    assert [r["completion"] for r in rows] == expected and all(expected)
    assert expected != _reference(toy["model"], None, PROMPTS, [], ",temperature=0.7,seed=4")
    assert _execution_lines(captured.err) == [
        "[fair-calib] low-bit execution: no --calib-dir: nothing quantized, every linear on "
        "the model's float32 weights"]


def test_text_output_and_chat_template(toy, capsys):
    """The plain output is a header line per prompt and the completion; ``--chat`` renders the
    prompt with the tokenizer's template, as the evaluation does for an Instruct model."""
    generate_cli.run_cli([str(toy["model"]), "--prompt", PROMPTS[1], "--chat", *SMALL])
    out = capsys.readouterr().out
    expected = _reference(toy["model"], None, PROMPTS[1:], [], instruct=True)
    assert out == f"=== 1/1: {PROMPTS[1]}\n{expected[0]}\n"
    lm = DiffusionLM.create_from_arg_string(f"pretrained={toy['model']},instruct=true",
                                            {"device": "cpu"})
    # the template was applied: w2, the prompt, <|eot_id|> (92), w1
    assert lm._prompt_ids(PROMPTS[1]) == [2, 9, 92, 1]


def test_prompts_files(tmp_path):
    text = tmp_path / "p.txt"
    text.write_text("w5 w6\n\n  \nw9\n")
    assert generate_cli.read_prompts_file(str(text)) == ["w5 w6", "w9"]
    lines = tmp_path / "p.jsonl"
    lines.write_text('"w5\\nw6"\n\n{"prompt": "w9", "id": 3}\n')
    assert generate_cli.read_prompts_file(str(lines)) == ["w5\nw6", "w9"]


def _refused(argv) -> str:
    with pytest.raises(SystemExit) as err:
        generate_cli.run_cli([str(a) for a in argv])
    msg = err.value.code
    assert isinstance(msg, str) and msg.startswith("error: fair-calib generate: ")
    assert "\n" not in msg
    return msg


def test_bad_arguments_are_refused_in_one_line_naming_them(toy, tmp_path):
    model, calib = toy["model"], toy["calib"]
    assert "no prompt" in _refused([model])
    assert "--prompt number 2 is empty" in _refused([model, "--prompt", "w5", "--prompt", " "])
    assert f"--prompts-file {tmp_path / 'no.txt'}: no such file" in \
        _refused([model, "--prompts-file", tmp_path / "no.txt"])
    (tmp_path / "empty.txt").write_text("\n\n")
    assert "holds no prompt" in _refused([model, "--prompts-file", tmp_path / "empty.txt"])
    (tmp_path / "bad.jsonl").write_text('"w5"\n{"text": "w9"}\n')
    assert f"--prompts-file {tmp_path / 'bad.jsonl'} line 2: expected a JSON string" in \
        _refused([model, "--prompts-file", tmp_path / "bad.jsonl"])
    (tmp_path / "bad2.jsonl").write_text("w5\n")
    assert "line 1: not JSON" in _refused([model, "--prompts-file", tmp_path / "bad2.jsonl"])
    assert "MODEL: model folder" in _refused([tmp_path / "nowhere", "--prompt", "w5"])
    assert "argument --dtype: invalid choice: 'int8'" in \
        _refused([model, "--prompt", "w5", "--dtype", "int8"])
    assert "unrecognized arguments: --gen_length" in \
        _refused([model, "--prompt", "w5", "--gen_length", "16"])
    assert "--family dream: " in _refused([model, "--prompt", "w5", "--family", "dream"])
    # decoding settings, before the model loads: 7 steps do not divide among 2 blocks of 8
    msg = _refused([model, "--prompt", "w5", "--gen-length", "16", "--steps", "7"])
    assert "given: --steps 7 --gen-length 16" in msg and "steps=7 do not divide" in msg
    # the family's default window (256 tokens) does not fit the toy's 128-token context
    assert "--gen-length 256 leaves no room for a prompt in the model's context of 128" in \
        _refused([model, "--prompt", "w5"])
    assert f"--calib-dir {tmp_path / 'nocalib'} does not exist" in \
        _refused([model, "--prompt", "w5", "--calib-dir", tmp_path / "nocalib", *SMALL])
    (tmp_path / "half").mkdir()
    assert "has no meta.json" in \
        _refused([model, "--prompt", "w5", "--calib-dir", tmp_path / "half", *SMALL])
    # a calibration of other weights (the LLaDA toy's, on the Dream toy)
    msg = _refused([toy["other"], "--prompt", "w5", "--calib-dir", calib, *SMALL])
    assert msg.startswith("error: fair-calib generate: --calib-dir: ") and str(calib) in msg
    assert "--chat: the tokenizer of" in _refused([toy["other"], "--prompt", "w5", "--chat",
                                                   *SMALL])
    tiny = tmp_path / "tiny"        # the family is read from fair_calib.json, before loading
    tiny.mkdir()
    (tiny / "fair_calib.json").write_text(json.dumps({"family": "tiny-llada"}))
    assert "--chat: the tiny-llada family formats no prompt with a chat template" in \
        _refused([tiny, "--prompt", "w5", "--chat"])
    if not torch.cuda.is_available():
        assert "--device cuda: CUDA is not available" in \
            _refused([model, "--prompt", "w5", "--device", "cuda"])
    assert "--device gpu0: not a torch device" in \
        _refused([model, "--prompt", "w5", "--device", "gpu0"])


def test_the_subcommand_refuses_in_one_line(toy):
    """Through `fair-calib` itself: one stderr line, exit status 1, no traceback."""
    proc = _cli([str(toy["model"]), "--prompt", "w5", "--steps", "7", "--gen-length", "16"])
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        proc.stderr.strip()] and "steps=7 do not divide among 2 blocks" in proc.stderr


def test_plain_lm_eval_does_not_find_the_model():
    """What the README says of plain `lm_eval --model fair_calib_dlm`: lm-eval 0.4.13 registers
    models on import only and never reads the installed `lm_eval.models` entry point, so its
    lookup fails where `fair-calib lm-eval` (which imports the model first) works. When an
    lm-eval release reads the group, this fails and the README's sentence must change."""
    import importlib.metadata as md

    import lm_eval

    try:
        declared = [ep for ep in md.distribution("fair-calib").entry_points
                    if ep.group == "lm_eval.models"]
    except md.PackageNotFoundError:
        declared = []
    if not declared:
        pytest.skip("the installed fair-calib metadata declares no lm_eval.models entry point")
    assert lm_eval.__version__ == "0.4.13"
    code = ("from lm_eval.api.registry import get_model\n"
            "try:\n    get_model('fair_calib_dlm')\nexcept ValueError as err:\n    print(err)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "Attempted to load model 'fair_calib_dlm', but no model for this name found" in \
        proc.stdout, proc.stderr[-2000:]
