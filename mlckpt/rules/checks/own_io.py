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

Rules 1.20 (``buffered_restores``) hold a buffered restore from the durable tier to the lower bound
too, where each rank reads files of its own (``checkpoint.restore=own``) through the engine: a
cold buffered read brings every byte not resident into the page cache through the block layer, on
the host's ranks' account.  A restore served by a fast tier in memory and labelled durable reads
nothing there.  And two checks of the same accounting judge what a mode claims:

- STALL-WRITES: what an asynchronous or tiered write's ranks wrote inside its counters' window is
  what their stages to files (this write's and the ones before it still running) had time to
  write in it, within ``margin`` either way: each stage's bytes pro rata of its time inside the
  window (at most every stage to files, a fast tier on a block device being charged too; at least
  the durable stages', a fast tier in memory being charged nothing), plus the requests each rank
  can have in flight at the window's edges.  A synchronous write
  presented as asynchronous wrote all its bytes before its counters were read, while its invented
  persist had barely begun.  Pro rata holds for O_DIRECT stages, charged request by request; a
  buffered stage is charged as it dirties the page cache, at memory speed, so of it only "not
  before it began" holds, and a buffered synchronous run presented as asynchronous is beyond
  this check.
- OBJECT-BYTES: an op on object storage moves its bytes over the network, so the kernel charges
  the host's ranks next to nothing through the block layer, either way: a run on files presented
  as one on object storage charged them every byte.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from mlckpt.attribution import OWN_KEYS, attributed
from mlckpt.rules.checks.evidence import counted_op
from mlckpt.rules.engine import Context, NotChecked, Outcome, Rule, RuleSet, checks_table
from mlckpt.rules.rundata import RunData, run_data
from mlckpt.workload.frameworks import ENGINE
from mlckpt.workload.pipeline import DURABLE, MEMORY

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
    buffered = bool(rule.params.get("buffered_restores")) and d.config["checkpoint"].get("restore") == "own"
    for (op, idx), recs in d.grouped().items():
        if op not in _DIRECTIONS:
            continue
        for host, hr in sorted(d.hosts(recs).items()):
            yield from _host_op(d, op, f"{op} {idx} on {host}", hr, fraction, slack, buffered)


def _host_op(d: RunData, op: str, where: str, hr: Sequence[Mapping[str, Any]], fraction: float,
             slack: int, buffered: bool = False) -> Iterator[Outcome]:
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
    if op == "read" and not all(r.get("direct") or (buffered and r.get("writer", ENGINE) == ENGINE)
                                for r in hr):
        return  # a rank may find pages of a file another rank of its host reads, or a library maps
    need = sum(int(r["bytes"]) - (int(r.get("resident_bytes", 0)) if op == "read" else 0) for r in hr)
    if got < need - allowance:
        yield Outcome(False, f"the host's ranks {did} at least the {need} B their records moved "
                      f"(-{allowance:.0f} B)", f"{got} B", where=where)


def _window(r: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """A host leader's counters around its op, where they attribute the ranks' own bytes."""
    hc = r.get("host_counters") or {}
    before, after = hc.get("before"), hc.get("after")
    keys = (*OWN_KEYS, "t_ns")
    if not (isinstance(before, Mapping) and isinstance(after, Mapping)
            and all(k in x for x in (before, after) for k in keys)):
        return None
    return before, after


def stall_writes(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """STALL-WRITES (rules 1.20): an asynchronous or tiered write's ranks wrote, inside the
    counters' window around its stall, what their stages to files had time to write in it."""
    d = run_data(ctx)
    if int(d.run.get("records_format", 0)) < 6:
        yield NotChecked("records before format 6 carry no accounting of the ranks' own bytes")
        return
    margin, fraction, slack = (float(rule.params["margin"]), float(rule.params["fraction"]),
                               int(rule.params["slack_bytes"]))
    writes: dict[tuple[int, int], Mapping[str, Any]] = {
        (int(r["rank"]), int(r["index"])): r for r in d.records if r["op"] == "write"}
    # an O_DIRECT request is charged as it is sent: at each edge of the window a rank can have
    # io.threads requests of io.block_size sent and not yet done
    in_flight = 2 * int(d.config["io"]["threads"]) * int(d.config["io"]["block_size"])
    for (op, idx), recs in d.grouped().items():
        if op != "write" or all(counted_op(d, r) for r in recs):
            continue  # a synchronous write's bytes are all inside its window: OWN-BYTES'
        for host, hr in sorted(d.hosts(recs).items()):
            leaders = [w for r in hr if (w := _window(r)) is not None]
            if len(leaders) != 1:
                continue  # no accounting on this host (DEVICE-COUNTERS names a missing leader)
            before, after = leaders[0]
            lo, hi = int(before["t_ns"]), int(after["t_ns"])
            ranks = [int(r["rank"]) for r in hr]
            running = [writes[(rank, k)] for rank in ranks for k in range(idx - 2, idx + 1)
                       if (rank, k) in writes]
            stages = [st for w in running for st in w.get("stages", ()) if st.get("tier") != MEMORY]
            # at most every stage to files (a fast tier on a block device is charged too); at
            # least the durable tier's O_DIRECT ones (a fast tier in memory is charged nothing)
            had_time = sum(_inside(st, lo, hi) for st in stages)
            durable = sum(_inside(st, lo, hi) for st in stages
                          if st.get("tier") == DURABLE and st.get("direct"))
            got = int(after["own_written_bytes"]) - int(before["own_written_bytes"])
            allowance = fraction * sum(int(r["bytes"]) for r in hr) + slack + len(hr) * in_flight
            where = f"write {idx} on {host}"
            if got > margin * had_time + allowance:
                yield Outcome(False, f"the host's ranks wrote at most {margin:g} × the {had_time:.0f} B "
                              f"their stages to files had time for in the {(hi - lo) / 1e6:.1f} ms window "
                              f"around the stall (+{allowance:.0f} B)", f"{got} B", where=where)
            elif got < durable / margin - allowance:
                yield Outcome(False, f"the host's ranks wrote at least 1/{margin:g} of the {durable:.0f} B "
                              f"their durable stages wrote in the {(hi - lo) / 1e6:.1f} ms window around "
                              f"the stall (-{allowance:.0f} B)", f"{got} B", where=where)


def _inside(stage: Mapping[str, Any], lo: int, hi: int) -> float:
    """What a stage can have been charged inside [lo, hi]: an O_DIRECT stage's bytes pro rata of
    its time inside it (each request is charged as it is sent); a buffered stage's every byte if it
    began before ``hi`` (the page cache takes them at memory speed, charged as they are dirtied)."""
    t0, t1 = int(stage["t0_ns"]), int(stage["t1_ns"])
    if not stage.get("direct"):
        return float(stage["bytes"]) if t0 < hi and t1 > lo else 0.0
    return int(stage["bytes"]) * max(0, min(t1, hi) - max(t0, lo)) / max(t1 - t0, 1)


def object_bytes(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """OBJECT-BYTES (rules 1.20): an op on object storage charged its host's ranks next to nothing
    through the block layer, either way."""
    d = run_data(ctx)
    if (d.run.get("storage") or {}).get("kind") != "s3":
        return
    fraction, slack = float(rule.params["fraction"]), int(rule.params["slack_bytes"])
    for (op, idx), recs in d.grouped().items():
        for host, hr in sorted(d.hosts(recs).items()):
            windows = [w for r in hr if (w := _window(r)) is not None]
            if len(windows) != 1:
                yield Outcome(False, "one host leader's accounting of its ranks' own bytes",
                              f"{len(windows)}", where=f"{op} {idx} on {host}")
                continue
            before, after = windows[0]
            allowance = fraction * sum(int(r["bytes"]) for r in hr) + slack
            for key, did in (("own_read_bytes", "read"), ("own_written_bytes", "wrote")):
                got = int(after[key]) - int(before[key])
                if got > allowance:
                    yield Outcome(False, f"the host's ranks {did} at most {allowance:.0f} B through the "
                                  "block layer (object storage moves an op's bytes over the network)",
                                  f"{got} B", where=f"{op} {idx} on {host}")


CHECKS = checks_table(own_bytes, stall_writes, object_bytes)
