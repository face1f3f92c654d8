"""``mlckpt-check``: validate a submission tree.

    mlckpt-check ROOT [--json FILE] [--trusted-keys FILE] [--trusted-witnesses FILE] [--rules VERSION]
                 [--jobs N] [--quiet]
    mlckpt-check check ROOT ...          (the same; ``check`` is the default subcommand)

Every command's arguments are defined here (:data:`COMMANDS`); its handler (taking the parsed
arguments, returning an exit status) is imported only when it runs, so ``--help`` stays fast:
``checker.leaderboard.command`` (``mlckpt-check leaderboard ROOT ...``) and ``checker.compare``
(``mlckpt-check compare A B``).  The tree check itself is :func:`checker.tree_check.check_tree`.

Exit statuses: 0 all valid, 1 rule errors, 2 usage, 3 integrity failure, 4 internal
error (see :mod:`checker.report`).  Usage errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checker import BUNDLE_BUDGET_S, MAX_RECORDS, TRUSTED_KEYS_FILE, TRUSTED_WITNESSES_FILE
from mlckpt import __version__
from mlckpt.command_line import OneLineParser, lazy_handler, run_guarded
from mlckpt.errors import UsageError

PROG = "mlckpt-check"
DEFAULT_COMMAND = "check"
LEADERBOARD_FORMATS = ("md", "csv", "json", "html")


# ----------------------------------------------------------------------------------------------
# Argument parsing: every command's arguments here, its handler imported only when it runs
# (the leaderboard pulls in pandas, the check the rules and the schemas: --help pays for neither).


def _tree_flags(p: Any, witnessed: str) -> None:
    """ROOT and the trust and parallelism flags every command that checks a tree takes."""
    p.add_argument("root", type=Path, metavar="ROOT", help="the submission tree")
    p.add_argument("--trusted-keys", type=Path, default=None, metavar="FILE",
                   help=f"organisation -> public keys (default: ROOT/{TRUSTED_KEYS_FILE})")
    p.add_argument("--trusted-witnesses", type=Path, default=None, metavar="FILE",
                   help=f"witness -> public keys: {witnessed} "
                   f"(default: ROOT/{TRUSTED_WITNESSES_FILE} if present)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="processes: bundles checked in parallel, and a large bundle's records and rules "
                   "shared among the jobs no other bundle takes (default: the number of CPUs)")
    p.add_argument("--bundle-budget", type=float, default=BUNDLE_BUDGET_S, metavar="SECONDS",
                   help="the most one bundle's check may take; a bundle past it gets a BUNDLE-SCHEMA "
                   f"finding and the others are still judged (default: {BUNDLE_BUDGET_S:g})")
    p.add_argument("--max-records", type=int, default=MAX_RECORDS, metavar="N",
                   help="the most records of one bundle the checker reads (it holds them all: about "
                   "5.6 KiB each); a bundle with more gets a BUNDLE-SCHEMA finding before any is parsed "
                   f"(default: {MAX_RECORDS:,}, one bundle's check under 1 GiB)")


@dataclass(frozen=True)
class Command:
    summary: str  # the one line --help lists
    description: str
    options: Callable[[Any], None]
    handler: Callable[[argparse.Namespace], int]


def _check_options(p: Any) -> None:
    _tree_flags(p, "witnessed runs signed by these count as witnessed")
    p.add_argument("--json", type=Path, default=None, metavar="FILE",
                   help="also write the JSON report to FILE ('-' for stdout)")
    p.add_argument("--rules", default=None, metavar="VERSION",
                   help="judge every bundle with this rules version (default: the one each bundle declares)")
    p.add_argument("-q", "--quiet", action="store_true", help="list only bundles with findings")


def _leaderboard_options(p: Any) -> None:
    _tree_flags(p, "results they witnessed are marked")
    p.add_argument("--format", choices=LEADERBOARD_FORMATS, default="md", help="output format (default: md)")
    p.add_argument("--out", type=Path, default=None, metavar="PATH",
                   help="write to PATH (default: stdout); html links to bundles relative to it")
    p.add_argument("--witnessed-only", action="store_true",
                   help="publish only results a trusted witness witnessed")
    p.add_argument("--published", type=Path, action="append", default=[], metavar="DIR",
                   help="also list the DLIO / mlpstorage results published under DIR (any level of an "
                   "MLPerf results tree), each marked UNVERIFIED below the checked results of its class; "
                   "repeatable")


def _compare_options(p: Any) -> None:
    p.add_argument("a", type=Path, metavar="A", help="bundle folder or .tar.gz (or a DLIO / mlpstorage "
                   "result folder: shown unverified)")
    p.add_argument("b", type=Path, metavar="B", help="bundle folder or .tar.gz (or a DLIO / mlpstorage "
                   "result folder)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a text table")
    p.add_argument("--trusted-witnesses", type=Path, default=None, metavar="FILE",
                   help="name the witness of a witnessed bundle from FILE (witness -> public keys)")
    p.add_argument("--trusted-keys", type=Path, default=None, metavar="FILE",
                   help="also require each signer to be registered in FILE (default: integrity "
                   "against the key embedded in each bundle)")


def _import_options(p: Any) -> None:
    p.add_argument("path", type=Path, metavar="PATH")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description="Validate mlckpt result bundles in a submission tree.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name, c in COMMANDS.items():
        p = sub.add_parser(name, help=c.summary, description=c.description)
        c.options(p)
        p.set_defaults(func=c.handler)
    return parser


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """``mlckpt-check ROOT ...`` means ``mlckpt-check check ROOT ...``."""
    args = list(argv)
    if args and (args[0] in COMMANDS or args[0] in ("-h", "--help", "--version")):
        return args
    return [DEFAULT_COMMAND, *args]


def _dispatch(argv: Sequence[str] | None) -> int:
    args_list = normalize_argv(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(args_list)
    return int(args.func(args) or 0)


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(run(argv))


def run(argv: Sequence[str] | None = None) -> int:
    """main() without sys.exit (for tests and embedding)."""
    return run_guarded(_dispatch, argv, prog=PROG)


# ----------------------------------------------------------------------------------------------
# check


def cmd_check(args: argparse.Namespace) -> int:
    from checker import report as rep
    from checker.rulesets import known_rules_versions
    from checker.tree_check import budget_of, check_tree, load_trusted, load_witnesses, max_records_of

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
    check_budget, max_records = budget_of(args), max_records_of(args)
    if args.json is not None and str(args.json) != "-":
        parent = args.json.parent if str(args.json.parent) else Path(".")
        if not parent.is_dir() or args.json.is_dir():
            raise UsageError(f"--json {args.json}: cannot write there (no such folder, or a folder)")
    trusted = load_trusted(root, args.trusted_keys)
    witnesses = load_witnesses(root, args.trusted_witnesses)
    report = check_tree(root, trusted, forced_rules=args.rules, jobs=jobs, witnesses=witnesses,
                        budget_s=check_budget, max_records=max_records)
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


# Every command, in the order --help lists them: its arguments here, its handler imported only when
# it runs (lazy_handler).
COMMANDS: dict[str, Command] = {
    "check": Command(
        "validate a submission tree (the default command)",
        "Verify, parse and judge every bundle under ROOT/{closed,open}/<org>/results/ with the rules "
        "each bundle declares.",
        _check_options, cmd_check),
    "leaderboard": Command(
        "publish tables of the results that pass the checker",
        "Check every bundle under ROOT (as `mlckpt-check ROOT` does) and publish the passing results, "
        "one table per class (division × workload × full/scaled × checkpoint mode), ranked by write "
        "bandwidth.",
        _leaderboard_options, lazy_handler("checker.leaderboard.command", "cmd_leaderboard")),
    "compare": Command(
        "two result bundles side by side, with ratios B/A",
        "Verify two bundles (folders or .tar.gz) and show their metrics side by side, with the ratio "
        "B/A. Exit 2 if either is not a bundle, 3 if either fails integrity.",
        _compare_options, lazy_handler("checker.compare", "cmd_compare")),
    "import": Command(
        "list the DLIO / mlpstorage results under a folder (unverified)",
        "Find every DLIO / mlpstorage checkpointing result under PATH, at any level of a published "
        "tree (a timestamp folder, a workload folder with both invocations of a split result, a system, a "
        "submitter), and list what was read and what could not be. Exit 1 when none was read.",
        _import_options, lazy_handler("checker.imported", "cmd_import")),
}
