"""``mlckpt-check``: validate a submission tree.

    mlckpt-check ROOT [--json FILE] [--trusted-keys FILE] [--trusted-witnesses FILE] [--rules VERSION]
                 [--jobs N] [--quiet]
    mlckpt-check check ROOT ...          (the same; ``check`` is the default subcommand)

Subcommands are modules listed in :data:`SUBCOMMAND_MODULES`, each exposing
``register(subparsers)`` that adds its parser and sets ``func`` (a handler taking the parsed
arguments and returning an exit status), exactly like ``mlckpt``'s own commands:
``checker.leaderboard.command`` (``mlckpt-check leaderboard ROOT ...``) and ``checker.compare``
(``mlckpt-check compare A B``).  The tree check itself is :func:`checker.tree_check.check_tree`.

Exit statuses (SPEC §7): 0 all valid, 1 rule errors, 2 usage, 3 integrity failure, 4 internal
error (see :mod:`checker.report`).  Usage errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from checker import report as rep
from checker.rulesets import known_rules_versions
from checker.tree_check import (
    TRUSTED_KEYS_FILE,
    TRUSTED_WITNESSES_FILE,
    check_tree,
    load_trusted,
    load_witnesses,
)
from mlckpt import __version__
from mlckpt.command import OneLineParser, run_guarded
from mlckpt.errors import UsageError

PROG = "mlckpt-check"
DEFAULT_COMMAND = "check"


def _leaderboard() -> Any:
    from checker.leaderboard import command

    return command


def _compare() -> Any:
    from checker import compare

    return compare


# name -> the module exposing register(subparsers), imported only when its command is used (the
# leaderboard pulls in pandas; checking a tree should not pay for it).
SUBCOMMAND_MODULES: dict[str, Any] = {"check": None, "leaderboard": _leaderboard, "compare": _compare}


# ----------------------------------------------------------------------------------------------
# Argument parsing


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "check", help="validate a submission tree (the default command)",
        description="Verify, parse and judge every bundle under ROOT/{closed,open}/<org>/results/ "
        "with the rules each bundle declares.")
    p.add_argument("root", type=Path, metavar="ROOT", help="the submission tree")
    p.add_argument("--json", type=Path, default=None, metavar="FILE",
                   help="also write the JSON report to FILE ('-' for stdout)")
    p.add_argument("--trusted-keys", type=Path, default=None, metavar="FILE",
                   help=f"organisation -> public keys (default: ROOT/{TRUSTED_KEYS_FILE})")
    p.add_argument("--trusted-witnesses", type=Path, default=None, metavar="FILE",
                   help=f"witness -> public keys: witnessed runs signed by these count as witnessed "
                   f"(default: ROOT/{TRUSTED_WITNESSES_FILE} if present)")
    p.add_argument("--rules", default=None, metavar="VERSION",
                   help="judge every bundle with this rules version (default: the one each bundle declares)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="bundles checked in parallel (default: the number of CPUs)")
    p.add_argument("-q", "--quiet", action="store_true", help="list only bundles with findings")
    p.set_defaults(func=cmd_check)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``command``, only that subcommand's module is imported besides ``check``
    (some pull in heavy libraries: checking a tree should not pay for pandas)."""
    parser = OneLineParser(prog=PROG, description="Validate mlckpt result bundles in a submission tree.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name, load in SUBCOMMAND_MODULES.items():
        if name == DEFAULT_COMMAND:
            register(sub)
        elif command is None or name == command:
            load().register(sub)
    return parser


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """``mlckpt-check ROOT ...`` means ``mlckpt-check check ROOT ...``."""
    args = list(argv)
    if args and (args[0] in SUBCOMMAND_MODULES or args[0] in ("-h", "--help", "--version")):
        return args
    return [DEFAULT_COMMAND, *args]


def _dispatch(argv: Sequence[str] | None) -> int:
    args_list = normalize_argv(sys.argv[1:] if argv is None else argv)
    command = args_list[0] if args_list[0] in SUBCOMMAND_MODULES else None
    args = build_parser(command).parse_args(args_list)
    return int(args.func(args) or 0)


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(run(argv))


def run(argv: Sequence[str] | None = None) -> int:
    """main() without sys.exit (for tests and embedding)."""
    return run_guarded(_dispatch, argv, prog=PROG)


# ----------------------------------------------------------------------------------------------
# check


def cmd_check(args: argparse.Namespace) -> int:
    root: Path = args.root
    if not root.is_dir():
        raise UsageError(f"{root}: not a folder (expected a submission tree)")
    try:
        os.listdir(root)
    except OSError as exc:
        raise UsageError(f"{root}: cannot read: {exc.strerror or exc}") from None
    if args.rules is not None and args.rules not in known_rules_versions():
        raise UsageError(f"--rules: unknown rules version {args.rules!r}; known: "
                         f"{', '.join(known_rules_versions())}")
    jobs = args.jobs if args.jobs is not None else (os.cpu_count() or 1)
    if jobs < 1:
        raise UsageError(f"--jobs: must be at least 1, got {jobs}")
    if args.json is not None and str(args.json) != "-":
        parent = args.json.parent if str(args.json.parent) else Path(".")
        if not parent.is_dir() or args.json.is_dir():
            raise UsageError(f"--json {args.json}: cannot write there (no such folder, or a folder)")
    trusted = load_trusted(root, args.trusted_keys)
    witnesses = load_witnesses(root, args.trusted_witnesses)
    report = check_tree(root, trusted, forced_rules=args.rules, jobs=jobs, witnesses=witnesses)
    text = rep.render_text(report, quiet=args.quiet)
    if args.json is not None:
        body = json.dumps(report, indent=1, ensure_ascii=False, allow_nan=False) + "\n"
        if str(args.json) == "-":
            sys.stdout.write(body)
            sys.stderr.write(text)
        else:
            try:
                args.json.write_text(body, encoding="utf-8")
            except OSError as exc:
                raise UsageError(f"--json {args.json}: cannot write: {exc.strerror or exc}") from None
            sys.stdout.write(text)
    else:
        sys.stdout.write(text)
    sys.stdout.flush()
    return int(report["exit_status"])
