"""A large bundle's rules on more than one core.

The rules of one bundle are independent of one another but for what they share through
``RunData`` (the records grouped by op and host, made once; the summary's recomputation and the
longest request of each histogram, which it finds).  Where ``--jobs`` leaves cores to a bundle
(a tree of fewer bundles than jobs), its rules are shared among forked workers: each takes the
next rule not yet taken (so a slow rule never leaves a worker idle), and the findings are put
back in the rules' order, exactly as :meth:`RuleSet.evaluate` gives them in one process
(tests/unit/checker/test_rule_workers.py).  The checks that read the summary stay in this process,
which keeps it for the report.  A worker that dies leaves its rules to this process; a rule that
raises raises here, the first in the rules' order, as it would in one process.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
from collections.abc import Iterable, Iterator, Sequence

from checker import forked
from mlckpt.rules import Context, Evaluation, RuleSet, RunData

# The checks that read what the summary's recomputation leaves in RunData: run where it is made.
SUMMARY_CHECKS = frozenset({"metrics_recompute", "summary_exact", "request_evidence"})

Part = tuple[int, Evaluation | BaseException]  # a rule's index and its part, or what it raised


def evaluate(ruleset: RuleSet, ctx: Context, stages: Sequence[str], workers: int, records: int) -> Evaluation:
    """``ruleset.evaluate(ctx, stages)``, on up to ``workers`` processes for a bundle of ``records``."""
    if workers <= 1 or records < forked.MIN_RECORDS or not forked.AVAILABLE:
        return ruleset.evaluate(ctx, stages)
    rules = ruleset.rules
    pinned = [i for i, r in enumerate(rules) if r.check in SUMMARY_CHECKS]
    shared = [i for i, r in enumerate(rules) if r.check not in SUMMARY_CHECKS]
    try:
        claimed = multiprocessing.get_context("fork").Value("i", 0)  # the next of ``shared`` to take
    except OSError:  # no shared memory to be had: one process
        return ruleset.evaluate(ctx, stages)
    warm(ctx)

    def take() -> Iterator[int]:
        while True:
            with claimed.get_lock():
                k = claimed.value
                claimed.value = k + 1
            if k >= len(shared):
                return
            yield shared[k]

    def worker() -> list[Part]:
        return [(i, forked.portable(x) if isinstance(x, BaseException) else x)
                for i, x in _run(ruleset, ctx, stages, take())]

    with contextlib.ExitStack() as stack:
        children = []
        for _ in range(workers - 1):
            try:
                children.append(stack.enter_context(forked.Forked(worker)))
            except OSError:  # no process to be had (limits, memory): fewer workers
                break
        done = dict(_run(ruleset, ctx, stages, itertools.chain(pinned, take())))
        for child in children:
            done.update(child.result()[1] or ())
    for i in range(len(rules)):  # a worker that died: its rules, here
        if i not in done:
            done.update(_run(ruleset, ctx, stages, [i]))
    return _in_order([done[i] for i in range(len(rules))])


def warm(ctx: Context) -> None:
    """What every rule shares, made before the fork so that no worker makes it again."""
    d = ctx.run
    if not isinstance(d, RunData):
        return
    for recs in d.grouped().values():
        d.hosts(recs)
    d.hosts()
    with contextlib.suppress(Exception):  # a bad configuration: the rules that read it say so
        d.pipeline  # noqa: B018 - a cached property, made here once


def _run(ruleset: RuleSet, ctx: Context, stages: Sequence[str], indices: Iterable[int]) -> Iterator[Part]:
    """Each rule's part, until one raises (that one's exception is its part)."""
    for i in indices:
        try:
            yield i, ruleset.evaluate_rule(ruleset.rules[i], ctx, stages)
        except Exception as exc:
            yield i, exc
            return


def _in_order(parts: Sequence[Evaluation | BaseException]) -> Evaluation:
    """The parts joined in the rules' order; the first exception raised, as one process would."""
    for part in parts:
        if isinstance(part, BaseException):
            raise part
    return Evaluation.joined(p for p in parts if isinstance(p, Evaluation))  # (all of them, by now)
