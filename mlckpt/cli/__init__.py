"""`mlckpt` command line: a thin dispatcher.

Each subcommand lives in its own module exposing ``register(subparsers)``; the module's handler
returns an exit status.  Every ``MlckptError`` becomes one line on stderr and its exit status
(SPEC §7); nothing else prints a traceback unless ``MLCKPT_DEBUG`` is set.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from mlckpt import __version__
from mlckpt.errors import InternalError, MlckptError, UsageError

# Subcommand modules, in the order `mlckpt --help` lists them.
COMMAND_MODULES = (
    "mlckpt.cli.plan_cmd",
    "mlckpt.cli.size_cmd",
    "mlckpt.cli.config_cmd",
    "mlckpt.cli.run_cmd",
    "mlckpt.cli.bundle_cmd",
)


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus an error; the contract is one line naming the problem."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="mlckpt",
        description="LLM checkpoint storage benchmark (plan, size, run, sign, verify).",
    )
    parser.add_argument("--version", action="version", version=f"mlckpt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a command not built yet in this checkout
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def run_guarded(func, *args, prog: str = "mlckpt") -> int:  # type: ignore[no-untyped-def]
    """Call ``func`` and turn every error into (one stderr line, exit status)."""
    try:
        return int(func(*args) or 0)
    except MlckptError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return err.exit_status
    except BrokenPipeError:
        # `mlckpt plan | head`: the reader left; not an error of ours.  Silence the final flush.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a defect: say so plainly, exit 4, keep the trace for debugging
        if os.environ.get("MLCKPT_DEBUG"):
            raise
        err = InternalError(f"internal error: {type(exc).__name__}: {exc} (set MLCKPT_DEBUG=1)")
        print(f"{prog}: error: {err}", file=sys.stderr)
        return err.exit_status


def _dispatch(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return int(args.func(args) or 0)


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(run_guarded(_dispatch, argv))
