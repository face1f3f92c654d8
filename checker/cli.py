"""``mlckpt-check``: validate a submission tree.

    mlckpt-check ROOT [--json FILE] [--trusted-keys FILE] [--rules VERSION] [--jobs N] [--quiet]
    mlckpt-check check ROOT ...          (the same; ``check`` is the default subcommand)

Subcommands are modules listed in :data:`SUBCOMMAND_MODULES`, each exposing
``register(subparsers)`` that adds its parser and sets ``func`` (a handler taking the parsed
arguments and returning an exit status), exactly like ``mlckpt``'s own commands.  Hooks for what
comes next: ``checker.leaderboard`` (``mlckpt-check leaderboard ROOT ...``) and
``checker.compare`` (``mlckpt-check compare A B``) are listed already and picked up as soon as the
modules exist; they can reuse :func:`check_tree` to get the validated bundles and their metrics.

Exit statuses (SPEC §7): 0 all valid, 1 rule errors, 2 usage, 3 integrity failure, 4 internal
error (see :mod:`checker.report`).  Usage errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from checker import report as rep
from checker.stages import (
    BundleResult,
    SystemInfo,
    Task,
    add_duplicates,
    check_bundle,
    fallback_rules,
    finding_dict,
    internal_result,
    known_rules_versions,
    load_system_file,
    submission_findings,
)
from checker.tree import SystemFile, TreeScan, walk
from mlckpt import __version__
from mlckpt.bundle import TrustedKeys
from mlckpt.cli import OneLineParser, run_guarded
from mlckpt.errors import UsageError
from mlckpt.rules.checks.submission import Problem, SubmissionFacts

PROG = "mlckpt-check"
DEFAULT_COMMAND = "check"
TRUSTED_KEYS_FILE = "trusted-keys.yaml"
# name -> module exposing register(subparsers); modules not present yet are skipped.
SUBCOMMAND_MODULES: dict[str, str] = {
    "check": "checker.cli",
    "leaderboard": "checker.leaderboard",
    "compare": "checker.compare",
}


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
    for name, module_name in SUBCOMMAND_MODULES.items():
        if name == DEFAULT_COMMAND:
            register(sub)
            continue
        if command is not None and name != command:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:  # not written yet
            if exc.name == module_name:
                continue
            raise
        module.register(sub)
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
    keys_path = args.trusted_keys
    if keys_path is None:
        keys_path = root / TRUSTED_KEYS_FILE
        if not keys_path.is_file():
            raise UsageError(f"no trusted keys: give --trusted-keys FILE or put {TRUSTED_KEYS_FILE} "
                             f"in {root}")
    trusted = TrustedKeys.load(keys_path)
    report = check_tree(root, trusted, forced_rules=args.rules, jobs=jobs)
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


def check_tree(root: Path, trusted: TrustedKeys, *, forced_rules: str | None = None,
               jobs: int = 1) -> dict[str, Any]:
    """Check every bundle under ``root``; the report as a dict (see :mod:`checker.report`)."""
    root = Path(root)
    scan = walk(root)
    fallback = fallback_rules(forced_rules)
    systems = _systems(root, scan, fallback.version)
    tasks = [Task(str(root), leaf, trusted, forced_rules,
                  systems[(leaf.division, leaf.org, leaf.system)]) for leaf in scan.leaves]
    results = _run_tasks(tasks, jobs)
    add_duplicates(results, forced_rules)
    tree_findings = _tree_findings(scan, systems, fallback, {(t.leaf.division, t.leaf.org, t.leaf.system)
                                                             for t in tasks})
    return rep.build(str(root), results, tree_findings)


def _systems(root: Path, scan: TreeScan, version: str) -> dict[tuple[str, str, str], SystemInfo]:
    files = {(s.division, s.org, s.system): s for s in scan.systems}
    keys = set(files) | {(leaf.division, leaf.org, leaf.system) for leaf in scan.leaves}
    out = {}
    for div, org, system in sorted(keys):
        sf: SystemFile | None = files.get((div, org, system))
        out[(div, org, system)] = load_system_file(root, sf, f"{div}/{org}/systems/{system}.yaml", version)
    return out


def _tree_findings(scan: TreeScan, systems: dict[tuple[str, str, str], SystemInfo], rs: Any,
                   used: set[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """Findings about the tree itself: misplaced entries, and system descriptions no bundle uses
    (a bundle that uses one reports its problems itself)."""
    out: list[dict[str, Any]] = []
    by_division: dict[str, dict[str, list[Any]]] = {}
    for div, problem in scan.problems:
        by_division.setdefault(div, {"layout": [], "system_description": []})["layout"].append(problem)
    for key, info in sorted(systems.items()):
        if info.doc is None and key not in used and info.problem != "missing":
            by_division.setdefault(key[0], {"layout": [], "system_description": []})[
                "system_description"].append(Problem(info.path, "a valid system description", info.problem))
    for div, facts in sorted(by_division.items()):
        sf = SubmissionFacts(layout=tuple(facts["layout"]),
                             system_description=tuple(facts["system_description"]))
        found, _ = submission_findings(rs, sf, div)
        wheres = {p.where: p.where for p in (*facts["layout"], *facts["system_description"])}
        out += [finding_dict(f, ".", wheres) for f in found]
    return out


def _run_tasks(tasks: list[Task], jobs: int) -> list[BundleResult]:
    if jobs <= 1 or len(tasks) <= 1:
        return [check_bundle(t) for t in tasks]
    ctx = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    results: list[BundleResult] = []
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=ctx) as pool:
        futures = [pool.submit(check_bundle, t) for t in tasks]
        for task, fut in zip(tasks, futures, strict=True):
            try:
                results.append(fut.result())
            except Exception as exc:  # the worker died (killed, out of memory): a checker fault
                results.append(internal_result(task.leaf, "worker", exc))
    return results
