"""OWN-BYTES (rules 1.18): what the kernel charged to a host's ranks over an op, direction by
direction, is what the op's records say those ranks moved.  Pure.

Each host's leader samples, around every op, what the kernel charged to the host's ranks
(``own_read_bytes``/``own_written_bytes``, records format 6: /proc/<pid>/io of every rank, all
its threads).  DEVICE-COUNTERS only asks that these bytes be part of what the device moved, so a
forger could charge another tenant's bytes to the ranks (hiding the tenant: its bytes are no longer
foreign) or leave a dropped rank's bytes there.  An honest op cannot help it: a write's ranks write
its files' bytes and read next to nothing, a restore's ranks read them (all of them when they read
with O_DIRECT) and write next to nothing.  So, per host and op, over the ops whose bytes cross the
device inside their own window (``counted_op``):

    in the op's direction    own ≤ moved + allowance;  and own ≥ need − allowance for a write
                             and an O_DIRECT restore (need: the bytes not resident before it)
    in the other direction   own ≤ allowance
    allowance                = fraction × moved + slack_bytes

``moved`` is each record's bytes, or its files' bytes on disk where a library wrote them
(``file_bytes``).  What it cannot see: a tenant's bytes charged to the ranks *in place of* bytes
the ranks moved, with the device's counters edited to match (only a witness of the device would).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from mlckpt.attribution import attributed
from mlckpt.rules.checks.evidence import counted_op
from mlckpt.rules.engine import Context, NotChecked, Outcome, Rule, RuleSet, checks_table
from mlckpt.rules.rundata import RunData, run_data

# What each direction of an op is called in its findings: (the op's own, the other).
_DIRECTIONS = {"write": (("own_written_bytes", "wrote"), ("own_read_bytes", "read")),
               "read": (("own_read_bytes", "read"), ("own_written_bytes", "wrote"))}


def own_bytes(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """OWN-BYTES: each host's ranks moved, per the kernel's accounting, the op's bytes in its
    direction and next to nothing in the other."""
    d = run_data(ctx)
    if int(d.run.get("records_format", 0)) < 6:
        yield NotChecked("records before format 6 carry no accounting of the ranks' own bytes")
        return
    fraction, slack = float(rule.params["fraction"]), int(rule.params["slack_bytes"])
    for (op, idx), recs in d.grouped().items():
        if op not in _DIRECTIONS:
            continue
        for host, hr in sorted(d.hosts(recs).items()):
            yield from _host_op(d, op, f"{op} {idx} on {host}", hr, fraction, slack)


def _host_op(d: RunData, op: str, where: str, hr: Sequence[Mapping[str, Any]], fraction: float,
             slack: int) -> Iterator[Outcome]:
    leaders = [r for r in hr if "host_counters" in r]
    if len(leaders) != 1 or not all(counted_op(d, r) for r in hr):
        return  # a host without one leader's counters is DEVICE-COUNTERS' to name
    hc = leaders[0]["host_counters"]
    before, after = hc.get("before"), hc.get("after")
    if hc.get("device") is None or not (attributed(before) and attributed(after)):
        return  # nothing the kernel accounts (object storage, a memory filesystem, /proc hidden)
    moved = sum(max(int(r["bytes"]), int(r.get("file_bytes", 0))) for r in hr)
    allowance = fraction * moved + slack
    (same, did), (other, other_did) = _DIRECTIONS[op]
    got = int(after[same]) - int(before[same])
    stray = int(after[other]) - int(before[other])
    if stray > allowance:
        yield Outcome(False, f"the host's ranks {other_did} at most {allowance:.0f} B during a {op} "
                      f"of {moved} B", f"{stray} B", where=where)
    if got > moved + allowance:
        yield Outcome(False, f"the host's ranks {did} at most the {moved} B their records moved "
                      f"(+{allowance:.0f} B)", f"{got} B", where=where)
    if op == "read" and not all(r.get("direct") for r in hr):
        return  # a buffered restore may find pages another rank's readahead brought in
    need = sum(int(r["bytes"]) - (int(r.get("resident_bytes", 0)) if op == "read" else 0) for r in hr)
    if got < need - allowance:
        yield Outcome(False, f"the host's ranks {did} at least the {need} B their records moved "
                      f"(-{allowance:.0f} B)", f"{got} B", where=where)


CHECKS = checks_table(own_bytes)
