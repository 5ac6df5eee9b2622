"""``fair-calib generate``: a model's completions of your own prompts, FP or quantized, loaded
and decoded as the evaluation does::

    fair-calib generate MODEL [--calib-dir DIR] --prompt TEXT [--prompt TEXT ...]
        [--prompts-file FILE] [--chat] [--until TEXT ...] [--policy NAME] [--steps N]
        [--gen-length N] [--block-length N] [--temperature T] [--alg-temp T] [--top-p P]
        [--top-k K] [--seed S] [--device DEV] [--dtype DTYPE] [--family F] [--loader L] [--jsonl]

``MODEL`` is what ``fair-calib lm-eval`` takes as ``pretrained=``: a checkpoint folder or a hub
id, its family inferred as there (``--family`` names it). The model is lm-eval's
``fair_calib_dlm`` (:class:`fair_calib.evaluate.lm.DiffusionLM`), built as ``fair-calib lm-eval``
builds it: a ``--calib-dir`` made on other weights is refused, the calibration is applied by
``load_quantized`` (its linears on integer codes where the GPU has them, ``FAIR_CALIB_LOWBIT``).
The completions are ``DiffusionLM.generate_until``'s: the family's default decoding policy (the
adapter's ``decoding``, which the evaluation runs where a task sets nothing; a task's own
``gen_length``/``steps`` are given here as flags) with the given settings over it, the prompt
cut to its last ``context - gen_length`` tokens, the output cut at the first EOS and then at
the earliest ``--until`` string. ``--chat`` renders each prompt as one user turn of the
tokenizer's chat template (as the evaluation does for an Instruct model).

Prompts: each ``--prompt``, then those of ``--prompts-file``: a ``.jsonl`` file holds one JSON
string or ``{"prompt": ...}`` object a line (prompts with newlines); any other file one prompt
a line, blank lines skipped.

stdout: per prompt, a line ``=== i/n: <the prompt on one line>`` then the completion;
``--jsonl``: one ``{"prompt", "completion"}`` object a line. stderr: the decoding policy and how
the linears run (``load_quantized``'s execution line, or that nothing is quantized).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

PROG = "fair-calib generate"
DTYPES = ("float32", "bfloat16", "float16")
# flag -> DiffusionLM decoding key (fair_calib.evaluate.lm.DECODING_KEYS)
DECODING_FLAGS = {"policy": "policy", "steps": "steps", "gen_length": "gen_length",
                  "block_length": "block_length", "temperature": "temperature",
                  "alg_temp": "alg_temp", "top_p": "top_p", "top_k": "top_k"}
HEADER_CHARS = 70


def fail(message: str) -> NoReturn:
    """One line on stderr and exit status 1 (cli.main passes a SystemExit through)."""
    sys.exit(f"error: {PROG}: {message}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:   # one line, not argparse's usage + error
        fail(message)


def build_parser() -> argparse.ArgumentParser:
    from fair_calib.decoding.policies import POLICIES
    from fair_calib.models.adapters import ADAPTERS, LOADERS

    ap = _Parser(prog=PROG, description="Complete prompts with a model (FP, or quantized with "
                 "--calib-dir), with the evaluation's loading and decoding.")
    ap.add_argument("model", help="checkpoint folder or hub id (lm-eval's pretrained=)")
    ap.add_argument("--calib-dir", help="a calibration of this model (results/calib/<model>/"
                    "<method>/<bits>); without it, the FP model")
    ap.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    ap.add_argument("--prompts-file", help="prompts: one a line, or .jsonl: one JSON string or "
                    "{\"prompt\": ...} a line")
    ap.add_argument("--chat", action="store_true",
                    help="render each prompt as a user turn of the tokenizer's chat template")
    ap.add_argument("--until", action="append", default=[],
                    help="cut the completion at this text (repeatable)")
    ap.add_argument("--policy", choices=POLICIES, help="commit rule (default: the family's)")
    ap.add_argument("--steps", type=int, help="decoding steps (default: the family's)")
    ap.add_argument("--gen-length", type=int, help="tokens decoded (default: the family's)")
    ap.add_argument("--block-length", type=int, help="block size of the block policies")
    ap.add_argument("--temperature", type=float, help="sampling temperature (0: argmax)")
    ap.add_argument("--alg-temp", type=float, help="temperature of the commit order (Dream)")
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--seed", type=int, default=0, help="seeds each prompt's draws (default 0)")
    ap.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda where there is one)")
    ap.add_argument("--dtype", choices=DTYPES, default="float32",
                    help="weights' dtype (default float32, as fair-calib lm-eval)")
    ap.add_argument("--family", choices=sorted(ADAPTERS), help="default: inferred")
    ap.add_argument("--loader", choices=LOADERS, help="native (default) or remote")
    ap.add_argument("--jsonl", action="store_true", help="one JSON object a prompt on stdout")
    return ap


# ------------------------------------------------------------------ prompts
def _jsonl_prompt(line: str, where: str) -> str:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as err:
        fail(f"{where}: not JSON ({err.msg}); a .jsonl prompts file holds one JSON string or "
             "{\"prompt\": ...} object a line")
    if isinstance(item, dict):
        item = item.get("prompt")
    if not isinstance(item, str):
        fail(f"{where}: expected a JSON string or an object with a string \"prompt\"")
    return item


def read_prompts_file(path: str) -> list[str]:
    """A ``.jsonl`` file's JSON prompts, else the file's non-blank lines."""
    file = Path(path)
    if not file.is_file():
        fail(f"--prompts-file {path}: no such file")
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        fail(f"--prompts-file {path}: cannot be read as UTF-8 text ({err})")
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if file.suffix == ".jsonl":
        prompts = [_jsonl_prompt(line, f"--prompts-file {path} line {n}") for n, line in numbered]
    else:
        prompts = [line for _, line in numbered]
    if not prompts:
        fail(f"--prompts-file {path} holds no prompt")
    return prompts


def collect_prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompt)
    for i, prompt in enumerate(prompts, 1):
        if not prompt.strip():
            fail(f"--prompt number {i} is empty")
    if args.prompts_file:
        prompts += read_prompts_file(args.prompts_file)
    if not prompts:
        fail("no prompt: give --prompt TEXT (repeatable) or --prompts-file FILE")
    return prompts


# ------------------------------------------------------------------ checks before loading
def model_family(args: argparse.Namespace) -> str:
    from fair_calib.checks.config import missing_model_folder
    from fair_calib.evaluate.lm import infer_family

    problem = missing_model_folder(args.model)
    if problem:
        fail(f"MODEL: {problem}")
    local = Path(args.model).is_dir()
    if args.family and not local:
        return args.family              # a hub id: its config is not read twice
    try:
        found = infer_family(args.model, args.calib_dir)
    except (ValueError, OSError, KeyError) as err:
        if args.family:
            return args.family
        reason = str(err).split(";")[0]
        fail(f"MODEL {args.model}: {reason}; name it with --family")
    if args.family and args.family != found:
        fail(f"--family {args.family}: {args.model} is a {found} checkpoint (its "
             "fair_calib.json or config.json says so)")
    return found


def decoding_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {key: getattr(args, flag) for flag, key in DECODING_FLAGS.items()
            if getattr(args, flag) is not None}


def _given_flags(overrides: dict[str, Any]) -> str:
    flags = {key: flag for flag, key in DECODING_FLAGS.items()}
    return " ".join(f"--{flags[k].replace('_', '-')} {v}" for k, v in overrides.items())


def checked_policy(family: str, overrides: dict[str, Any]):
    """The policy generate_until will run, validated before the model loads."""
    from fair_calib.evaluate.lm import decoding_policy
    from fair_calib.models.adapters import get_adapter

    adapter = get_adapter(family)
    try:
        return decoding_policy(adapter, overrides)
    except ValueError as err:
        given = _given_flags(overrides) or "none"
        fail(f"decoding settings (given: {given}; the {family} defaults: "
             f"{json.dumps(adapter.decoding)}): {err}")


def checked_device(device: str | None) -> str | None:
    """A torch device name; ``cuda`` where CUDA is absent is refused (lm-eval's CLI would fall
    back to the CPU; here the device was asked for by name)."""
    if device is None:
        return None
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        fail(f"--device {device}: not a torch device (cpu, cuda, cuda:N)")
    if dev.type == "cuda" and not torch.cuda.is_available():
        fail(f"--device {device}: CUDA is not available on this machine")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        fail(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def checked_calib_dir(calib_dir: str | None) -> None:
    if calib_dir is None:
        return
    if not Path(calib_dir).is_dir():
        fail(f"--calib-dir {calib_dir} does not exist: calibrate first "
             f"(snakemake {calib_dir}/meta.json), or pass an existing one")
    if not (Path(calib_dir) / "meta.json").is_file():
        fail(f"--calib-dir {calib_dir} has no meta.json: not a finished calibration "
             f"(snakemake {calib_dir}/meta.json finishes it)")


# ------------------------------------------------------------------ loading and decoding
def load_lm(args: argparse.Namespace, family: str, overrides: dict[str, Any]):
    """The evaluation's model: ``DiffusionLM`` from keyword arguments, as lm-eval builds it
    from ``--model_args`` (``fair-calib lm-eval``)."""
    from fair_calib.evaluate.lm import CalibrationMismatchError, DiffusionLM
    from fair_calib.jobs.io import CorruptFileError

    try:
        return DiffusionLM(pretrained=args.model, family=family, dtype=args.dtype,
                           device=args.device, calib_dir=args.calib_dir, instruct=args.chat,
                           seed=args.seed, decoding=overrides, loader=args.loader)
    except CalibrationMismatchError as err:
        fail(f"--calib-dir: {err}")
    except (CorruptFileError, FileNotFoundError) as err:   # each names its file
        fail(str(err))


def check_family_chat(family: str) -> None:
    """``--chat`` needs a family whose prompts take a chat template (before the model loads)."""
    from fair_calib.models.adapters import get_adapter

    if not get_adapter(family).chat_template:
        fail(f"--chat: the {family} family formats no prompt with a chat template")


def check_tokenizer_chat(lm, model: str) -> None:
    """``--chat`` needs the tokenizer's template (known once the model is loaded)."""
    if getattr(lm.tokenizer, "chat_template", None) is None:
        fail(f"--chat: the tokenizer of {model} has no chat template (a Base checkpoint?); "
             "leave out --chat")


def report_cut_prompts(lm, prompts: list[str], policy) -> None:
    """A prompt longer than the window leaves is cut to its last tokens (as the evaluation
    cuts it); say so rather than let it pass unseen."""
    room = lm.max_length - policy.gen_length
    if room < 1:
        fail(f"--gen-length {policy.gen_length} leaves no room for a prompt in the model's "
             f"context of {lm.max_length} tokens")
    for i, prompt in enumerate(prompts, 1):
        n = len(lm._prompt_ids(prompt))
        if n > room:
            print(f"[fair-calib] prompt {i}: {n} tokens, cut to its last {room} (context "
                  f"{lm.max_length} - gen_length {policy.gen_length}), as the evaluation cuts "
                  "it", file=sys.stderr, flush=True)


def generate(lm, prompts: list[str], until: list[str], on_result=None) -> list[str]:
    """``DiffusionLM.generate_until`` over the prompts, as lm-eval's requests; ``on_result(i,
    text)`` as each completion finishes."""
    from lm_eval.api.instance import Instance

    requests = [Instance("generate_until", {}, (prompt, {"until": list(until)}), i)
                for i, prompt in enumerate(prompts)]
    lm.on_generated = on_result
    try:
        return lm.generate_until(requests)
    finally:
        lm.on_generated = None


# how far a run got, for the interrupt's line (fair_calib/cli/main.py)
PROGRESS = {"printed": 0, "total": 0}


def interrupted_line(how: str) -> str:
    done, total = PROGRESS["printed"], PROGRESS["total"]
    if not total:
        return f"fair-calib generate: interrupted ({how}) before any completion"
    return (f"fair-calib generate: interrupted ({how}) after {done} of {total} completions, "
            f"printed above as each finished; the other {total - done} were not generated "
            "(rerun with those prompts)")


def execution_note(args: argparse.Namespace) -> None:
    """How the linears run: ``load_quantized`` logs it for a calibration; say it for FP."""
    if args.calib_dir is None:
        print(f"[fair-calib] low-bit execution: no --calib-dir: nothing quantized, every "
              f"linear on the model's {args.dtype} weights", file=sys.stderr, flush=True)


def policy_line(policy, family: str) -> str:
    settings = ", ".join(f"{k}={v}" for k, v in policy.to_dict().items() if v is not None)
    return f"[fair-calib] decoding ({family} defaults with the given settings): {settings}"


def print_completion(prompts: list[str], i: int, text: str, jsonl: bool) -> None:
    """One completion, printed (and flushed) as soon as it is done: ``=== <n>/<N>: <prompt>``
    and the text, or one JSON line with the prompt's ``index`` (from 0)."""
    prompt = prompts[i]
    if jsonl:
        print(json.dumps({"index": i, "prompt": prompt, "completion": text}, ensure_ascii=False))
    else:
        shown = prompt.replace("\n", "\\n")
        if len(shown) > HEADER_CHARS:
            shown = shown[:HEADER_CHARS - 3] + "..."
        print(f"=== {i + 1}/{len(prompts)}: {shown}")
        print(text)
    sys.stdout.flush()
    PROGRESS["printed"] += 1


def run_cli(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    prompts = collect_prompts(args)
    family = model_family(args)
    overrides = decoding_overrides(args)
    policy = checked_policy(family, overrides)
    args.device = checked_device(args.device)
    checked_calib_dir(args.calib_dir)
    if args.chat:
        check_family_chat(family)
    lm = load_lm(args, family, overrides)
    if args.chat:
        check_tokenizer_chat(lm, args.model)
    execution_note(args)
    print(policy_line(policy, family), file=sys.stderr, flush=True)
    report_cut_prompts(lm, prompts, policy)
    PROGRESS.update(printed=0, total=len(prompts))
    # each completion printed as it finishes (the evaluation's batches: longest prompts first)
    generate(lm, prompts, args.until,
             on_result=lambda i, text: print_completion(prompts, i, text, args.jsonl))


if __name__ == "__main__":
    run_cli(sys.argv[1:])
