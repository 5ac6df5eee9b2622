"""One subcommand per stage. Thin: each stage module owns its argument parsing in
``run_cli(argv)`` and does the work in a pure function over files."""
from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "make-data": "fair_calib.models.tiny.corpus",   # synthetic corpus and task files
    "train-tiny": "fair_calib.models.tiny.train",   # train an embedded tiny diffusion LM
    "convert-hub": "fair_calib.models.toy_hub",     # a tiny model in a hub checkpoint layout
    "probe": "fair_calib.probe",                    # Stage I: random-commit teacher rollouts
    "prior": "fair_calib.prior",                    # Stage I: aggregate the position prior
    "calibrate": "fair_calib.calibrate",            # Stage II: layer-wise calibration
    "evaluate": "fair_calib.evaluate.run",          # benchmarks through lm-eval
    "trajectories": "fair_calib.diagnostics",       # record decoding trajectories
    "diagnose": "fair_calib.diagnostics",           # diagnostics from trajectories
    "report": "fair_calib.report.tables",           # LaTeX tables
    "figures": "fair_calib.report.figures",         # PDF/PNG figures
    "lm-eval": "fair_calib.lm_eval_cli",            # lm-eval's own CLI, fair_calib_dlm registered
    "render-tasks": "fair_calib.lm_eval_cli",       # offline / synthetic task YAMLs for it
    "cost": "fair_calib.cost",                      # GPU-hours of a config's DAG
}
# These read their own subcommand name (one module serves two of them).
WHOLE_ARGV = ("trajectories", "diagnose", "lm-eval", "render-tasks")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        names = "\n  ".join(f"{k:14s} {v}" for k, v in SUBCOMMANDS.items())
        msg = f"usage: fair-calib <subcommand> [options]\n\nsubcommands:\n  {names}\n"
        if argv and argv[0] not in ("-h", "--help"):
            sys.exit(f"unknown subcommand {argv[0]!r}\n\n{msg}")
        print(msg)
        return
    module = importlib.import_module(SUBCOMMANDS[argv[0]])
    module.run_cli(argv if argv[0] in WHOLE_ARGV else argv[1:])


if __name__ == "__main__":
    main()
