"""Check functions that hold a run's records against each host's clocks and physics (rules 1.2
on).  Pure: HOST-CLOCKS (each rank's wall clock against its host's boot and the records' order)
and HOST-PHYSICS (no host moved bytes faster than its memory copies them, nor through links it
does not have).  Bounds from ``rules.yaml`` (``evidence:``)."""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from mlckpt.rules.checks.evidence import Rec, evidence_bounds, host_facts, op_end
from mlckpt.rules.engine import Context, NotChecked, Outcome, Rule, RuleSet, checks_table
from mlckpt.rules.rundata import at, by_host, run_data
from mlckpt.workload.pipeline import MEMORY

# Filesystems whose bytes cross the host's network links (the link-speed bound applies).
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "beegfs",
        "cifs",
        "smb3",
        "ceph",
        "fuse.glusterfs",
        "orangefs",
        "panfs",
        "wekafs",
    }
)



def _iso(text: str) -> float | None:
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return None


def host_clocks(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """Each record's wall-clock start and monotonic t0 are read together, so on one host their
    difference is the same for every record (up to NTP slew); every op lies inside the run's
    started..ended; and hosts with different names are different machines (boot ids, clocks)."""
    d, b = run_data(ctx), evidence_bounds(ruleset)["clocks"]
    started, ended = _iso(str(d.run.get("started"))), _iso(str(d.run.get("ended")))
    offsets: dict[str, list[float]] = {}
    for r in d.records:
        wall = float(r.get("wall_start", 0.0))
        offsets.setdefault(str(r["host"]), []).append(wall - int(r["t0_ns"]) / 1e9)
        if started is not None and ended is not None:
            end = wall + (op_end(r) - int(r["t0_ns"])) / 1e9
            if wall < started - b["iso_s"] or end > ended + b["iso_s"]:
                yield Outcome(
                    False,
                    f"inside the run ({d.run.get('started')} .. {d.run.get('ended')})",
                    f"{wall - started:+.3f} s .. {end - ended:+.3f} s relative",
                    where=at(r),
                )
                return
    span = max((int(r["t1_ns"]) for r in d.records), default=0) - min(
        (int(r["t0_ns"]) for r in d.records), default=0
    )
    allowed = b["offset_s"] + b["slew"] * span / 1e9
    for host, offs in sorted(offsets.items()):
        if max(offs) - min(offs) > allowed:
            yield Outcome(
                False,
                f"one wall-minus-monotonic offset per host (within {allowed * 1e3:.1f} ms)",
                f"{(max(offs) - min(offs)) * 1e3:.1f} ms apart",
                where=f"host {host}",
            )
    facts = host_facts(d)
    hosts = sorted(offsets)
    for i, a in enumerate(hosts):
        for h in hosts[i + 1 :]:
            ba, bb = facts.get(a, {}).get("boot_id"), facts.get(h, {}).get("boot_id")
            if ba and ba == bb:
                yield Outcome(False, "distinct machines", f"{a} and {h} share boot id {ba}")
            elif abs(statistics.median(offsets[a]) - statistics.median(offsets[h])) < b["same_clock_s"]:
                yield Outcome(
                    False, "distinct machines", f"{a} and {h} run on one clock (booted the same instant)"
                )


def host_rates(recs: Sequence[Rec], tier: str | None = None) -> Iterator[tuple[str, float, int]]:
    """(host, bytes per second, bytes) of each host in one op: its ranks' bytes over the window
    from the first rank's start to the last rank's end.  The window, not the slowest rank's own
    span: ranks whose stages did not overlap (an async snapshot after different back-pressure
    waits) did not move their bytes at once, and summing them over one span overstated the host's
    rate 4× in an honest run under load."""
    for host, hr in sorted(by_host(recs).items()):
        if tier is None:
            windows = [(int(r["t0_ns"]), int(r["t1_ns"])) for r in hr]
        else:
            windows = [
                (int(s["t0_ns"]), int(s["t1_ns"]))
                for r in hr
                for s in r.get("stages", ())
                if s.get("tier") == tier
            ]
            if not windows:
                continue
        span = max(b for _, b in windows) - min(a for a, _ in windows)
        total = sum(int(r["bytes"]) for r in hr)
        if span > 0 and total > 0:
            yield host, total / (span / 1e9), total


def remote_store(facts: Mapping[str, Any]) -> bool:
    """An object store (rules 1.6) reached over the host's links: not on its loopback address."""
    fs = facts.get("filesystem") or {}
    host = str(fs.get("source") or "").rsplit(":", 1)[0].strip("[]")
    return fs.get("fs_type") == "s3" and host not in ("localhost", "::1") and not host.startswith("127.")


def host_physics(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """No host moves checkpoint bytes faster than its own memory can copy them (measured by the
    runner on that host), nor faster than its network links where the storage is remote; a
    snapshot into memory (the async stall) obeys the memory bound too."""
    d, b = run_data(ctx), evidence_bounds(ruleset)["physics"]
    facts = host_facts(d)
    measured = False
    for (op, idx), recs in sorted(d.grouped().items()):
        tiers = [None, MEMORY] if op == "write" else [None]
        for tier in tiers:
            for host, rate, _ in host_rates(recs, tier):
                f = facts.get(host, {})
                copy = f.get("memory_copy_gib_s")
                what = f"{op} {idx}" + (" (memory stage)" if tier == MEMORY else "") + f" on {host}"
                if isinstance(copy, int | float) and copy > 0:
                    measured = True
                    limit = b["memory_copy_multiple"] * copy * 2**30
                    if rate > limit:
                        yield Outcome(
                            False,
                            f"at most {limit / 2**30:.1f} GiB/s ({b['memory_copy_multiple']}× "
                            f"the host's measured memory copy rate)",
                            f"{rate / 2**30:.1f} GiB/s",
                            where=what,
                        )
                links = f.get("net_links_mbps") or {}
                fs = (f.get("filesystem") or {}).get("fs_type")
                if tier is None and links and (fs in NETWORK_FILESYSTEMS or remote_store(f)):
                    measured = True
                    limit = b["link_margin"] * sum(links.values()) * 1e6 / 8
                    if rate > limit:
                        yield Outcome(
                            False,
                            f"at most {limit / 1e9:.2f} GB/s (the host's {fs} traffic over "
                            f"links of {sum(links.values())} Mb/s)",
                            f"{rate / 1e9:.2f} GB/s",
                            where=what,
                        )
    if not measured:
        yield NotChecked("no host facts with a measured memory copy rate or network links")


CHECKS = checks_table(host_clocks, host_physics)
