"""lm-eval's own command line, with the project's diffusion LM registered.

lm-eval 0.4.13 finds models in its registry only, and a third-party model is registered when
its module is imported; it has no entry-point plugin group for models (``--include_path`` is
for tasks). So this module imports ``fair_calib.evaluate.lm`` (which registers
``fair_calib_dlm``) and hands the unchanged argument list to lm-eval's CLI::

    python -m fair_calib.cli.lm_eval_cli --model fair_calib_dlm \\
        --model_args pretrained=GSAI-ML/LLaDA-8B-Base,calib_dir=results/calib/...,mc_num=128,cfg=0.5 \\
        --tasks arc_challenge --batch_size 8 --num_fewshot 0 --limit 2 \\
        --output_path out/ --log_samples

(``fair-calib lm-eval ...`` is the same command.) Every lm-eval flag and task works as in
``lm_eval``; ``--batch_size`` is the estimator's rows per forward, as in the authors' scripts.

``fair-calib render-tasks --out DIR [--data-dir D] [--synthetic-dir S] [--tasks ...]`` writes
the project's offline (local data copies) or embedded synthetic task YAMLs into ``DIR`` for
``--include_path DIR``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def offline_fewshot_refusal(argv: list[str]) -> str | None:
    """The refusal lm-eval's run would reach only after loading the model: k-shot of a task
    rendered here offline (``render-tasks``: its folder holds ``fc_task_utils.py``) whose copy
    has no few-shot pool. None when the arguments can run."""
    from fair_calib.evaluate.offline_data import NO_OFFLINE_FEWSHOT_POOL

    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--tasks", default="")
    ap.add_argument("--num_fewshot", type=int, default=None)
    ap.add_argument("--include_path", default=None)
    args, _ = ap.parse_known_args(argv)
    if not args.num_fewshot or not args.include_path:
        return None
    include = Path(args.include_path)
    if not (include / "fc_task_utils.py").is_file():
        return None
    for task in args.tasks.split(","):
        if task in NO_OFFLINE_FEWSHOT_POOL and (include / f"{task}.yaml").is_file():
            return (f"--tasks {task} --num_fewshot {args.num_fewshot}: the offline {task} in "
                    f"{include} has no few-shot pool (the `train` split); use lm-eval's own "
                    f"task (no --include_path) or --num_fewshot 0")
    return None


def forward_to_lm_eval(argv: list[str]) -> None:
    """Run lm-eval's CLI on ``argv`` with ``fair_calib_dlm`` registered. The faults a user
    makes on its command line (an unknown task, a calibration of another model, a broken
    checkpoint file) end in one line naming them instead of lm-eval's traceback."""
    refusal = offline_fewshot_refusal(argv)
    if refusal:
        sys.exit(f"Error: {refusal}")
    from fair_calib.evaluate.lm import CalibrationMismatchError  # registers the model
    from fair_calib.evaluate.template_cache import install as compile_templates_once
    from fair_calib.jobs.io import CorruptFileError
    from lm_eval.__main__ import cli_evaluate

    compile_templates_once()
    saved = sys.argv
    sys.argv = ["lm-eval", *argv]
    try:
        cli_evaluate()
    except (CalibrationMismatchError, CorruptFileError) as err:
        sys.exit(f"error: fair-calib lm-eval: {err}")
    except ValueError as err:
        if not str(err).startswith("Tasks not found"):
            raise
        sys.exit(f"error: fair-calib lm-eval: --tasks: {str(err).split(': ', 1)[-1]} not found "
                 "among lm-eval's tasks and those under --include_path (list them: fair-calib "
                 "lm-eval ls tasks; the offline and synthetic ones: fair-calib render-tasks)")
    finally:
        sys.argv = saved


def render_tasks(out: str | Path, tasks: list[str] | None, data_dir: str | None = None,
                 synthetic_dir: str | None = None) -> Path:
    """Offline YAMLs (over ``data_dir``) and/or synthetic ones (over ``synthetic_dir``).
    Without ``tasks``: the synthetic tasks where ``synthetic_dir`` is given, and the offline
    ones where ``data_dir`` is given or neither is (the default data dir)."""
    from fair_calib.evaluate import offline_data

    out = Path(out).resolve()
    if tasks is None:  # every task the given folders hold
        tasks = list(offline_data.SYNTHETIC_TASKS) if synthetic_dir else []
        if data_dir or not synthetic_dir:
            tasks += offline_data.available_offline_tasks(data_dir or offline_data.default_data_dir())
    synth = [t for t in tasks if t in offline_data.SYNTHETIC_TASKS]
    recipes = [t for t in tasks if t in offline_data.RECIPE_TASKS]   # named only, never default
    real = [t for t in tasks if t not in offline_data.SYNTHETIC_TASKS and t not in recipes]
    if recipes:
        offline_data.write_recipe_tasks(out, recipes, True, data_dir or
                                        offline_data.default_data_dir(), out / "_cache")
    if synth:
        offline_data.write_synthetic_tasks(synthetic_dir or "resources/data", out, synth)
    if real:
        offline_data.write_offline_tasks(data_dir or offline_data.default_data_dir(),
                                         out / "_cache", out, real)
    return out


def render_tasks_cli(argv: list[str]) -> None:
    from fair_calib.evaluate.offline_data import OFFLINE_TASKS, SYNTHETIC_TASKS

    ap = argparse.ArgumentParser(prog="fair-calib render-tasks", description=render_tasks.__doc__)
    ap.add_argument("--out", required=True, help="folder for lm-eval's --include_path")
    ap.add_argument("--tasks", nargs="+", default=None,
                    help=f"default: {' '.join(SYNTHETIC_TASKS)} with --synthetic-dir, and "
                         f"those of {' '.join(OFFLINE_TASKS)} whose copies the data dir holds, with "
                         f"--data-dir or without either")
    ap.add_argument("--data-dir", default=None, help="offline data copies (FAIR_CALIB_DATA_DIR)")
    ap.add_argument("--synthetic-dir", default=None, help="embedded synthetic tasks (make-data)")
    args = ap.parse_args(argv)
    print(render_tasks(args.out, args.tasks, args.data_dir, args.synthetic_dir))


def run_cli(argv: list[str]) -> None:
    """``argv[0]``: ``lm-eval`` (forward the rest) or ``render-tasks``."""
    if argv and argv[0] == "render-tasks":
        render_tasks_cli(argv[1:])
    else:
        forward_to_lm_eval(argv[1:] if argv and argv[0] == "lm-eval" else argv)


if __name__ == "__main__":
    forward_to_lm_eval(sys.argv[1:])
