"""``python -m fair_calib.cli <subcommand> ...``: the stages' command line (fair_calib/cli/main.py)."""
from fair_calib.cli.main import main

main()
