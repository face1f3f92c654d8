"""The tree check: every bundle under a submission tree checked (in a process pool), duplicates
across bundles, findings about the tree itself, and the report.  Used by ``mlckpt-check ROOT``
and by the leaderboard, which must agree on what passes."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from checker import BUNDLE_BUDGET_S, MAX_RECORDS, TRUSTED_KEYS_FILE, TRUSTED_WITNESSES_FILE
from checker import report as rep
from checker.bundle_check import check_bundle, internal_result
from checker.duplicates import add_duplicates
from checker.results import BundleResult, SystemInfo, Task
from checker.rulesets import fallback_rules, finding_dict, load_system_file, submission_findings
from checker.split import add_splits
from checker.tree import SystemFile, TreeScan, walk
from mlckpt.bundle import SIGNATURE_FILE, WITNESSES, TrustedKeys
from mlckpt.errors import UsageError
from mlckpt.rules import Problem, RuleSet, SubmissionFacts

RELEASED_RUNNERS_FILE = "released-runners.yaml"  # RUNNER-RELEASED; not checked without it


def load_released(root: Path) -> frozenset[str] | None:
    """The runner digests ROOT/released-runners.yaml lists, or None without that file."""
    from mlckpt.bundle.released import load_released as load

    path = Path(root) / RELEASED_RUNNERS_FILE
    return load(path) if path.is_file() else None


def load_trusted(root: Path, given: Path | None) -> TrustedKeys:
    """``given``, or ROOT/trusted-keys.yaml; a missing file is a usage error naming both. A ROOT
    that is one bundle is refused first, with the command that makes it a tree."""
    if (Path(root) / SIGNATURE_FILE).is_file():
        raise UsageError(f"{root} is one bundle, not a submission tree: `mlckpt place {root} TREE` puts "
                         "it in one (with its system description and, in a new tree, its key), then "
                         "`mlckpt-check TREE`")
    path = given
    if path is None:
        path = root / TRUSTED_KEYS_FILE
        if not path.is_file():
            raise UsageError(f"no trusted keys: give --trusted-keys FILE or put {TRUSTED_KEYS_FILE} "
                             f"in {root}")
    return TrustedKeys.load(path)


def load_witnesses(root: Path, given: Path | None) -> TrustedKeys | None:
    """``given``, or ROOT/trusted-witnesses.yaml when there is one; None without either (no
    result is then counted as witnessed)."""
    path = given if given is not None else Path(root) / TRUSTED_WITNESSES_FILE
    if given is None and not path.is_file():
        return None
    return TrustedKeys.load(path, WITNESSES)


def budget_of(args: Any) -> float:
    """``--bundle-budget``, refused unless a positive number of seconds."""
    budget = float(args.bundle_budget)
    if not 0 < budget < float("inf"):
        raise UsageError(f"--bundle-budget: a positive number of seconds, got {args.bundle_budget}",
                         key="--bundle-budget")
    return budget


def max_records_of(args: Any) -> int:
    """``--max-records``, refused unless a positive whole number."""
    if args.max_records < 1:
        raise UsageError(f"--max-records: at least 1, got {args.max_records}", key="--max-records")
    return int(args.max_records)


def check_tree(root: Path, trusted: TrustedKeys, *, forced_rules: str | None = None,
               jobs: int = 1, witnesses: TrustedKeys | None = None,
               budget_s: float = BUNDLE_BUDGET_S, max_records: int = MAX_RECORDS) -> dict[str, Any]:
    """Check every bundle under ``root``, each within ``budget_s`` and ``max_records``; the report
    as a dict (see :mod:`checker.report`)."""
    root = Path(root)
    scan = walk(root)
    fallback = fallback_rules(forced_rules)
    systems = _systems(root, scan, fallback.version)
    released = load_released(root)
    workers = max(1, jobs // max(1, len(scan.leaves)))  # the jobs no other bundle takes: its rules'
    tasks = [Task(str(root), leaf, trusted, forced_rules,
                  systems[(leaf.division, leaf.org, leaf.system)], released, witnesses, budget_s,
                  max_records, workers)
             for leaf in scan.leaves]
    results = _run_tasks(tasks, jobs)
    add_duplicates(results, forced_rules)
    add_splits(results, forced_rules)
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


def _tree_findings(scan: TreeScan, systems: dict[tuple[str, str, str], SystemInfo], ruleset: RuleSet,
                   used: set[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """Findings about the tree itself: misplaced entries, and system descriptions no bundle uses
    (a bundle that uses one reports its problems itself)."""
    out: list[dict[str, object]] = []
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
        found, _ = submission_findings(ruleset, sf, div)
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
