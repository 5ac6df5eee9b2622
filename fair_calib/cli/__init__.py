"""The command lines. ``python -m fair_calib.cli <subcommand>`` (and the ``fair-calib`` console
script) run ``main``: one subcommand per stage, each run as a job (settings checked, output
locked, log opened, card taken) before the stage module's ``run_cli``.

``main``         the subcommand table and the job around each stage
``generate_cli`` ``fair-calib generate``: a model's completions of your prompts
``lm_eval_cli``  ``fair-calib lm-eval`` / ``render-tasks``: lm-eval's own CLI, the model registered
"""
