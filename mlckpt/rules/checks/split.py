"""Split invocations: a write invocation that keeps its checkpoints, and a read-only invocation
(``checkpoint.num_writes=0 checkpoint.restore_from=...``) that restores them, as MLPerf Storage
runs its phases (with whatever the operator does in between: a failover, a remap, flushing the
array's caches).  Pure: what makes two runs a pair, judged the same way by the runner before any
I/O and by the checker on the two bundles; and the SPLIT-PAIR check over the checker's facts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from mlckpt.rules.checks.submission import _report
from mlckpt.rules.engine import CheckFn, Context, NotChecked, Outcome, Rule, RuleSet

# What the read invocation must share with the write invocation for its restores to be the
# write's checkpoints, read the way a single invocation would read them.
SAME = ("workload", "ranks", "scale", "division", "residency", "checkpoint.restore")


def _get(config: Mapping[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def pair_problems(write_run: Mapping[str, Any], write_config: Mapping[str, Any],
                  read_config: Mapping[str, Any]) -> list[str]:
    """Why the write invocation (its run.json and config) cannot be restored by a read-only
    invocation of ``read_config``; empty when it can."""
    out = []
    ck = write_config.get("checkpoint", {})
    if not int(ck.get("num_writes") or 0):
        out.append("it wrote no checkpoint")
    if not ck.get("keep"):
        out.append("it did not keep its checkpoints (run it with checkpoint.keep=true)")
    if ck.get("mode") != "sync" or (ck.get("tiers") or {}).get("fast"):
        out.append("it is not a synchronous one-tier run")
    if write_run.get("restored_from"):
        out.append("it is itself a read-only invocation")
    if write_run.get("verdict") == "invalid":
        out.append("its verdict is invalid")
    for key in SAME:
        if _get(write_config, key) != _get(read_config, key):
            out.append(f"{key} differs ({_get(write_config, key)!r} there, {_get(read_config, key)!r} here)")
    return out


def split_pair(ctx: Context, rs: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """SPLIT-PAIR: a read-only invocation's write half is in the tree, unchanged (its signed
    statement's digest), compatible (:func:`pair_problems`), and ended before the reads began."""
    yield from _report(ctx, "split")


CHECKS: dict[str, CheckFn] = {"split_pair": split_pair}
