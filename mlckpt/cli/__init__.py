"""`mlckpt` command line: a thin dispatcher.

Each subcommand lives in its own module exposing ``register(subparsers)``; the module's handler
returns an exit status.  Every ``MlckptError`` becomes one line on stderr and its exit status
(docs: Verdicts and exit statuses); nothing else prints a traceback unless ``MLCKPT_DEBUG`` is set.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

import mlckpt.cli._threads  # noqa: F401  (first: one BLAS thread per process, before numpy loads)
from mlckpt import __version__
from mlckpt.command_line import OneLineParser, run_guarded
from mlckpt.errors import ExitStatus

# Subcommand modules, in the order `mlckpt --help` lists them; imported when needed (a refusal
# under srun must come before Hydra and numpy load).
COMMAND_MODULES = ("plan_cmd", "size_cmd", "goodput_cmd", "config_cmd", "run_cmd", "report_cmd", "bundle_cmd",
                   "place_cmd", "describe_cmd", "witness_cmd")


def build_parser() -> argparse.ArgumentParser:
    from mlckpt.cli.hydra_app import flag_hint

    parser = OneLineParser(
        hint=flag_hint,  # `mlckpt plan --workload X`: the settings are key=value overrides
        prog="mlckpt",
        description="LLM checkpoint storage benchmark (plan, size, run, sign, verify).",
    )
    parser.add_argument("--version", action="version", version=f"mlckpt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name in COMMAND_MODULES:
        importlib.import_module(f"mlckpt.cli.{name}").register(sub)
    return parser


# Commands whose settings are overrides: mlpstorage's --flags are taken there (mlckpt.plan.aliases).
OVERRIDE_COMMANDS = ("run", "plan", "size", "config")


def _mlpstorage_flags(argv: list[str]) -> list[str]:
    from mlckpt.plan.aliases import flags
    from mlckpt.run.site_mpi import speaks

    rest, notes = flags(argv[1:])
    if speaks(os.environ):  # once per launch, not once per rank
        for note in notes:
            print(f"mlckpt: note: {note}", file=sys.stderr, flush=True)
    return [argv[0], *rest]


def _dispatch(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in OVERRIDE_COMMANDS:
        argv = _mlpstorage_flags(argv)
    if argv[:1] == ["run"]:  # Hydra's own parser reads `mlckpt run`'s flags and overrides
        from mlckpt.run.site_mpi import refuse_slurm_without_pmi

        refuse_slurm_without_pmi(os.environ)
        from mlckpt.cli import run_cmd

        return run_cmd.handle_argv(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return ExitStatus.OK
    return int(args.func(args) or 0)


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(run_guarded(_dispatch, argv))
