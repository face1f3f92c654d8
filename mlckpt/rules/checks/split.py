"""Split invocations: a write invocation that keeps its checkpoints, and a read-only invocation
(``checkpoint.num_writes=0 checkpoint.restore_from=...``) that restores them, as MLPerf Storage
runs its phases (with whatever the operator does in between: a failover, a remap, flushing the
array's caches).  Pure: what makes two runs one split result, judged the same way by the runner before any
I/O and by the checker on the two bundles; and the SPLIT-PAIR check over the checker's facts.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator, Mapping
from typing import Any

from mlckpt.rules.checks.submission import report_problems
from mlckpt.rules.engine import CheckFn, Context, NotChecked, Outcome, Rule, RuleSet

# What the read invocation must share with the write invocation for its restores to be the
# write's checkpoints, read the way a single invocation would read them.
SAME = ("workload", "ranks", "scale", "division", "residency", "checkpoint.restore")


# Run format 10 (rules 1.10): a write invocation publishes a commitment to its content key, and the
# read invocation that restored it publishes the commitment's preimage, which only the key (left
# beside the checkpoints, never in a bundle) yields.  So a read invocation cannot be joined to another
# write invocation without that one's key, and the checker verifies the split without seeing a key.
_PROOF_DOMAIN = b"mlckpt split content proof v1\0"


def content_proof(key: bytes) -> str:
    """What a read invocation publishes of the write invocation's content key (run.json restored_from)."""
    return hashlib.sha256(_PROOF_DOMAIN + key).hexdigest()


def content_commitment(key: bytes) -> str:
    """What a write invocation publishes of its content key (run.json content_commitment)."""
    return hashlib.sha256(bytes.fromhex(content_proof(key))).hexdigest()


def proof_matches(proof: object, commitment: object) -> bool:
    """Whether ``proof`` (a read invocation's) opens ``commitment`` (its write invocation's)."""
    try:
        opened = hashlib.sha256(bytes.fromhex(str(proof))).hexdigest()
    except ValueError:
        return False
    return isinstance(commitment, str) and hmac.compare_digest(opened, commitment)


def _get(config: Mapping[str, object], dotted: str) -> object:
    node: object = config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def split_problems(write_run: Mapping[str, Any], write_config: Mapping[str, Any],
                  read_config: Mapping[str, object]) -> list[str]:
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


def split_pair(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """SPLIT-PAIR: a read-only invocation's write invocation is in the tree, unchanged (its signed
    statement's digest), compatible (:func:`split_problems`), and ended before the reads began."""
    yield from report_problems(ctx, "split")


def split_evidence(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """SPLIT-EVIDENCE (rules 1.10): a read-only invocation proves it held its write invocation's content
    key (:func:`proof_matches`), and on a host that did not reboot between the invocations both read
    one wall-minus-monotonic clock offset (:func:`clock_problems`)."""
    yield from report_problems(ctx, "split_evidence")


def host_clocks(records: Any, system: Any) -> dict[str, dict[str, object]]:
    """Per host of an invocation's records: its boot id (system.json), the median of its records'
    wall-clock start minus monotonic t0, its first op's wall-clock start and its last op's end."""
    boots = {str(h.get("hostname")): h.get("boot_id") for h in (system or {}).get("hosts", ())
             if isinstance(h, Mapping)}
    by_host: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        by_host.setdefault(str(r["host"]), []).append(r)
    out: dict[str, dict[str, object]] = {}
    for host, mine in sorted(by_host.items()):
        offsets = sorted(float(r["wall_start"]) - int(r["t0_ns"]) / 1e9 for r in mine)
        out[host] = {"boot_id": boots.get(host), "offset_s": offsets[len(offsets) // 2],
                     "first_s": min(float(r["wall_start"]) for r in mine),
                     "last_s": max(float(r["wall_start"]) + (int(r["t1_ns"]) - int(r["t0_ns"])) / 1e9
                                   for r in mine)}
    return out


def clock_problems(write: Mapping[str, Any], read: Mapping[str, Any], offset_s: float,
                   slew: float) -> list[tuple[str, str]]:
    """(expected, got) for each host of both invocations, on one boot, whose two offsets
    (:func:`host_clocks`) differ by more than ``offset_s`` + ``slew`` × the time between the invocations:
    an invocation's wall-clock times moved without its monotonic ones (to widen the gap between them)."""
    out = []
    for host in sorted(set(write) & set(read)):
        w, r = write[host], read[host]
        if not w.get("boot_id") or w.get("boot_id") != r.get("boot_id"):
            continue  # rebooted between the invocations (allowed): two clocks, nothing to compare
        allowed = offset_s + slew * max(0.0, float(r["first_s"]) - float(w["last_s"]))
        apart = abs(float(r["offset_s"]) - float(w["offset_s"]))
        if apart > allowed:
            out.append((f"host {host}: one wall-minus-monotonic clock offset in both invocations on boot "
                        f"{w['boot_id']} (within {allowed * 1e3:.1f} ms)", f"{apart:.3f} s apart"))
    return out


CHECKS: dict[str, CheckFn] = {"split_pair": split_pair, "split_evidence": split_evidence}
