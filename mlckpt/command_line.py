"""What both command lines (``mlckpt`` and ``mlckpt-check``) share: an argparse parser whose
errors are one line, and the guard that turns every error into one stderr line and its exit
status (docs: Verdicts and exit statuses)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from mlckpt.errors import ExitStatus, InternalError, MlckptError, UsageError


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus an error; the contract is one line naming the problem, and
    ``hint`` (given the message) may add its remedy."""

    def __init__(self, *args: Any, hint: Callable[[str], str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hint = hint

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}{self.hint(message) if self.hint else ''}")


def run_guarded(func: Callable[..., int | None], *args: object, prog: str = "mlckpt") -> int:
    """Call ``func`` and turn every error into (one stderr line, exit status)."""
    try:
        return int(func(*args) or 0)
    except MlckptError as err:
        if err.message:  # empty: another process of the same launch says it (one line, not N)
            print(f"{prog}: error: {err}", file=sys.stderr)
        return err.exit_status
    except BrokenPipeError:
        # `mlckpt plan | head`: the reader left; not an error of ours.  Silence the final flush.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitStatus.BROKEN_PIPE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return ExitStatus.INTERRUPTED
    except Exception as exc:  # a defect: say so plainly, exit 4, keep the trace for debugging
        if os.environ.get("MLCKPT_DEBUG"):
            raise
        fault = InternalError(f"internal error: {type(exc).__name__}: {exc} (set MLCKPT_DEBUG=1)")
        print(f"{prog}: error: {fault}", file=sys.stderr)
        return fault.exit_status


def override_key(override: str) -> str:
    """The key a Hydra override sets: '++io.threads=8' → 'io.threads'; '~cache' → 'cache'."""
    key = override.split("=", 1)[0].lstrip("+~")
    return key.split("@", 1)[0]


def lazy_handler(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """A command's handler that imports ``module`` only when the command runs: building the parser
    (and so ``--help``) loads none of the libraries the command needs."""

    def handle(args: argparse.Namespace) -> int:
        return int(getattr(importlib.import_module(module), name)(args) or 0)

    handle.__qualname__ = f"{module}.{name}"
    return handle
