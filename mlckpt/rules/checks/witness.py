"""Witnessed runs (rules 1.4): the bundle's records held against the witness's signed transcript.
Pure.

The checker opens ``witness.dsse.json`` (the witness's own signature, then the transcript's
schema) and collects :class:`WitnessFacts`; the checks below judge the rest from plain values.
What a witness's interval for an op means: from the witness receiving the op's start (the runner
sends it before the op's barrier) to the witness receiving its end (sent once every rank's last
byte is durable or read), on the witness's monotonic clock.  It contains the op.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from mlckpt.rules.checks.timing import start_allowance_s
from mlckpt.rules.engine import CheckFn, Context, NotChecked, Outcome, Rule, RuleSet, checks_table
from mlckpt.rules.rundata import RunData
from mlckpt.units import GiB

TRANSCRIPT = "witness.dsse.json"


@dataclass(frozen=True)
class WitnessFacts:
    """What the checker found of a bundle's witness."""

    claim: Mapping[str, Any] | None  # run.json's ``witness`` (None: the run claims none)
    present: bool  # the bundle holds witness.dsse.json
    problem: str | None = None  # why the transcript cannot be read or its signature fails
    signer: str | None = None  # the key id whose signature over the transcript holds
    transcript: Mapping[str, object] | None = None  # signature valid and schema-valid
    trusted_as: str | None = None  # the witness's name in the trusted-witnesses file
    trust_list: bool = False  # a trusted-witnesses file was given
    run: Mapping[str, object] | None = None  # run.json
    records: Sequence[Mapping[str, object]] = ()
    plan_digest: str | None = None  # recomputed from the bundle's config (None: no plan)
    bundle_signer: str | None = None  # the key id whose signature over the bundle holds

    @property
    def claimed(self) -> bool:
        return bool(self.claim) and self.claim.get("status") == "witnessed"  # type: ignore[union-attr]

    @property
    def witnessed(self) -> bool:
        """Counted as witnessed: claimed, transcript signed by a trusted witness."""
        return self.claimed and self.transcript is not None and self.trusted_as is not None


@dataclass(frozen=True)
class OpSpan:
    """One op as the records and the witness see it."""

    op: str
    index: int
    duration_s: float  # the records': the slowest rank, barrier to last byte
    interval_s: float  # the witness's: start received to end received
    answered_s: float  # the witness's: start answered (the op cannot begin before) to end received
    bytes: int
    wall_start: tuple[float, float]  # earliest and latest rank wall clock at the op's start
    start_wall_s: float  # the witness's wall clock at the start and at the end
    end_wall_s: float
    lag_s: float = 0.0  # witness format 2: how late the witness's own loop may have stamped the end
    leader: Mapping[str, Any] | None = None  # rank 0's record (the rank that talks to the witness)


def _facts(ctx: Context) -> WitnessFacts | None:
    return getattr(ctx.submission, "witness", None)


def entries(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(doc.get("entries", ()))


def max_rtt_s(doc: Mapping[str, object]) -> float:
    rtts = [e["rtt_ns"] for e in entries(doc) if e.get("kind") == "rtt"]
    return max(rtts, default=0) / 1e9


def spans(doc: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> list[OpSpan]:
    """Every op the witness saw start and end that the records hold, in the witness's order."""
    recs: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in records:
        recs.setdefault((str(r.get("op")), int(r.get("index", 0))), []).append(r)
    out, started = [], {}
    for e in entries(doc):
        if e.get("kind") == "start":
            started[(e["op"], e["index"])] = e
        elif e.get("kind") == "end" and (e["op"], e["index"]) in started and (e["op"], e["index"]) in recs:
            s, op_records = started[(e["op"], e["index"])], recs[(e["op"], e["index"])]
            walls = [float(r.get("wall_start", 0)) for r in op_records]
            interval = (e["t_mono_ns"] - s["t_mono_ns"]) / 1e9
            served = min(e.get("start_service_ns", 0) / 1e9, interval)
            out.append(OpSpan(e["op"], e["index"], max((r["t1_ns"] - r["t0_ns"]) / 1e9 for r in op_records),
                              interval, interval - served, sum(int(r["bytes"]) for r in op_records),
                              (min(walls), max(walls)), s["t_wall_ns"] / 1e9, e["t_wall_ns"] / 1e9,
                              e.get("lag_ns", 0) / 1e9,
                              next((r for r in op_records if r.get("rank") == 0), None)))
    return out


def figures(facts: WitnessFacts) -> dict[str, object]:
    """The witness-conservative bandwidths (bytes over the witness's own interval), GiB/s."""
    if facts.transcript is None:
        return {}
    out: dict[str, object] = {}
    for op in WITNESSED_OPS:
        bws = [s.bytes / s.answered_s / GiB for s in spans(facts.transcript, facts.records)
               if s.op == op and s.answered_s > 0]
        if bws:
            out[f"{op}_bandwidth_witnessed_mean_gib_s"] = sum(bws) / len(bws)
    out["witness_max_rtt_ms"] = max_rtt_s(facts.transcript) * 1e3
    return out


def witness_mode(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    """WITNESS-MODE: witness.url only with checkpoint.mode=sync and no fast tier."""
    if not ctx.get("witness.url"):
        return Outcome(True)
    mode, fast = ctx.get("checkpoint.mode"), ctx.get("checkpoint.tiers.fast")
    return Outcome(mode == "sync" and not fast, "checkpoint.mode=sync with no fast tier",
                   f"checkpoint.mode={mode}" + (f", checkpoint.tiers.fast={fast}" if fast else ""))


def witness_transcript(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    f = _facts(ctx)
    if f is None:
        yield NotChecked("not reached: an earlier stage stopped this bundle")
        return
    if not f.claimed:
        yield Outcome(not f.present, "no transcript (run.json: not witnessed)", f"{TRANSCRIPT} present",
                      where=TRANSCRIPT)
        return
    if not f.present:
        yield Outcome(False, f"{TRANSCRIPT} (run.json: witnessed by {f.claim['endpoint']})",  # type: ignore[index]
                      "no transcript", where="run.json")
        return
    yield Outcome(True)


def _opened(f: WitnessFacts | None) -> NotChecked | None:
    if f is None:
        return NotChecked("not reached: an earlier stage stopped this bundle")
    if f.claimed and f.transcript is None:
        return NotChecked("no transcript whose witness signature holds "
                          "(see WITNESS-TRANSCRIPT, WITNESS-SIGNATURE)")
    return None


def _claimed(ctx: Context) -> WitnessFacts | Outcome | NotChecked:
    """The facts of a run that claims a witness whose transcript opened; else what the check
    yields instead (not checked, or a pass for a run that claims none)."""
    f = _facts(ctx)
    skip = _opened(f)
    if skip is not None:
        return skip
    assert f is not None
    return f if f.claimed else Outcome(True)


def witness_signature(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome | NotChecked:
    f = _facts(ctx)
    if f is None or not f.claimed or not f.present:
        return Outcome(True) if f is not None else NotChecked("not reached")
    keyid = f.claim["keyid"]  # type: ignore[index]
    if f.problem is not None:
        return Outcome(False, f"a transcript signed by the key with fingerprint {keyid[:16]}", f.problem,
                       where=TRANSCRIPT)
    return Outcome(f.signer == keyid, f"signed by the key with fingerprint {keyid[:16]} (run.json's witness)",
                   f"signed by {str(f.signer)[:16]}…", where=TRANSCRIPT)


def witness_trusted(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome | NotChecked:
    f = _claimed(ctx)
    if not isinstance(f, WitnessFacts):
        return f
    if not f.trust_list:
        return NotChecked("no --trusted-witnesses file given: the result is not counted as witnessed")
    return Outcome(f.trusted_as is not None, "a key of the trusted-witnesses file",
                   f"key {str(f.signer)[:16]}… (not a trusted witness)", where=TRANSCRIPT)


Failures = Iterator[Outcome]


def _on_transcript(judge: Callable[[WitnessFacts, RuleSet], Failures]) -> CheckFn:
    """A check of a claimed witness against its opened transcript: ``judge`` yields the failures;
    none is a pass.  Runs that claim no witness pass; no opened transcript: not checked."""

    def check(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome | NotChecked | list[Outcome]:
        f = _claimed(ctx)
        if not isinstance(f, WitnessFacts):
            return f
        assert f.transcript is not None and f.claim is not None
        return list(judge(f, ruleset)) or Outcome(True)

    check.__name__ = judge.__name__
    return check


def witness_run(facts: WitnessFacts, ruleset: RuleSet) -> Failures:
    doc, claim, run = facts.transcript, facts.claim, facts.run or {}
    opening = entries(doc)[0]  # type: ignore[arg-type]
    said = opening.get("config", {})
    compared = [("the witness's run", claim["run"], doc["run"]),  # type: ignore[index]
             ("run_id", run.get("run_id"), said.get("run_id")),
             ("name", run.get("name"), said.get("name"))]
    if facts.plan_digest is not None:
        compared.append(("plan digest", facts.plan_digest, opening.get("plan_digest")))
    if "opened_by" in opening and facts.bundle_signer is not None:  # witness format 2: who opened it
        compared.append(("opened by the bundle's signing key", facts.bundle_signer, opening["opened_by"]))
    for what, want, got in compared:
        if want != got:
            yield Outcome(False, f"{what} {want}", f"{what} {got} in the transcript", where=TRANSCRIPT)


# The ops a witness times, in the order a run reports them: a checkpoint run's writes, then its
# restores; a serving run's loads (rules 1.16).
WITNESSED_OPS = ("write", "read", "load")


def _expected_ops(records: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, int]]:
    out = []
    for op in WITNESSED_OPS:
        for k in sorted({int(r["index"]) for r in records if r.get("op") == op}):
            out += [("start", op, k), ("end", op, k)]
    return out


def witness_events(facts: WitnessFacts, ruleset: RuleSet) -> Failures:
    es = entries(facts.transcript)  # type: ignore[arg-type]
    seen = [(e["kind"], e["op"], e["index"]) for e in es if e.get("kind") in ("start", "end")]
    want = _expected_ops(facts.records)
    if seen != want:
        at = next((i for i, (a, b) in enumerate(zip(seen, want, strict=False)) if a != b),
                  min(len(seen), len(want)))
        show = lambda xs: " ".join(f"{k} {o} {i}" for k, o, i in xs[at:at + 2]) or "nothing"  # noqa: E731
        yield Outcome(False, f"{len(want)} op events ({show(want)} at event {at + 1})",
                      f"{len(seen)} ({show(seen)} at event {at + 1})", where=TRANSCRIPT)
    if not es or es[-1].get("kind") != "close":
        yield Outcome(False, "a closed run", "no close", where=TRANSCRIPT)
    issued = [e.get("nonce") for e in es if e.get("kind") == "start" and e.get("op") == "write"]
    nonces = list(facts.claim["nonces"])  # type: ignore[index]
    if nonces != issued:
        yield Outcome(False, f"the run's write nonces as issued ({len(issued)})",
                      f"run.json's witness.nonces ({len(nonces)}, other values)", where="run.json")


def witness_times(facts: WitnessFacts, ruleset: RuleSet) -> Failures:
    b = ruleset.data["witness"]
    rtt = max_rtt_s(facts.transcript)  # type: ignore[arg-type]
    for s in spans(facts.transcript, facts.records):  # type: ignore[arg-type]
        # rules 1.8: plus the wait the host's own calibration allows before the ranks start
        short = (b["rtt_multiple"] * rtt + b["slack_s"] + b["slack_fraction"] * s.answered_s
                 + start_allowance_s(ruleset, facts.run or {}))
        if s.duration_s > s.interval_s + b["over_s"] or s.answered_s - s.duration_s > short:
            yield Outcome(False, f"{s.op} {s.index}: a duration within {s.answered_s - short:.3f}.."
                          f"{s.interval_s + b['over_s']:.3f} s (the witness's interval {s.answered_s:.3f} s "
                          f"from answering the start, largest round trip {rtt * 1e3:.1f} ms)",
                          f"{s.duration_s:.3f} s", where="records.jsonl")


@dataclass(frozen=True)
class Account:
    """Rules 1.10: one witnessed op's interval as rank 0 accounts for it.  Rank 0 records its own
    time from reading the start's answer to its op's start (``pre_s``) and from its op's end to
    sending the end (``post_s``).  What the witness saw beyond the op's duration (``excess_s``) is
    rank 0's own time around the op (``host_s``) plus what nobody timed (``gap_s``: the trips,
    the host waking rank 0 for the answer, the witness's own lag).  Only the witness's lag and
    round trips are the witness's measurements; the rest is the host's, so the whole excess is
    bounded (``bound_s``), and a run that recorded its op shorter than it was moved the
    difference into it."""

    span: OpSpan
    pre_s: float
    own_s: float  # rank 0's own t1 - t0
    post_s: float
    bound_s: float  # the most excess_s may be: round trips, lag, the host's allowance

    @property
    def excess_s(self) -> float:
        return self.span.answered_s - self.span.duration_s

    @property
    def gap_s(self) -> float:
        return self.span.answered_s - (self.pre_s + self.own_s + self.post_s)

    @property
    def host_s(self) -> float:
        return self.pre_s + self.own_s + self.post_s - self.span.duration_s


def accounts(facts: WitnessFacts, ruleset: RuleSet) -> list[OpSpan | Account]:
    """Each witnessed op's account (rules 1.10, ``witness.account_s``); the bare span of an op
    whose rank 0 record carries no ``witness_host_ns``."""
    b = ruleset.data["witness"]
    rtt = max_rtt_s(facts.transcript)  # type: ignore[arg-type]
    allowance = start_allowance_s(ruleset, facts.run or {})
    out: list[OpSpan | Account] = []
    for s in spans(facts.transcript, facts.records):  # type: ignore[arg-type]
        host = (s.leader or {}).get("witness_host_ns")
        if not isinstance(host, list) or len(host) != 2 or s.leader is None:
            out.append(s)
            continue
        out.append(Account(s, host[0] / 1e9, (s.leader["t1_ns"] - s.leader["t0_ns"]) / 1e9, host[1] / 1e9,
                           b["rtt_multiple"] * rtt + s.lag_s + b["account_s"] + b["host_floor_s"]
                           + b["host_fraction"] * s.answered_s + allowance))
    return out


def witness_account(facts: WitnessFacts, ruleset: RuleSet) -> Failures:
    """WITNESS-TIMES under rules 1.10: what cannot be: an op longer than its witnessed interval,
    or rank 0 accounting for more time around its op than the witness saw; and every op's
    account is recorded."""
    over = float(ruleset.data["witness"]["over_s"])
    for a in accounts(facts, ruleset):
        s = a if isinstance(a, OpSpan) else a.span
        if s.duration_s > s.interval_s + over:
            yield Outcome(False, f"{s.op} {s.index}: a duration within the witness's interval "
                          f"{s.interval_s:.3f} s (+{over * 1e3:g} ms)", f"{s.duration_s:.3f} s",
                          where="records.jsonl")
        elif isinstance(a, OpSpan):
            yield Outcome(False, f"{s.op} {s.index}: rank 0's witness_host_ns (its own time around "
                          "the op, which the witness's interval is held against)", "none",
                          where="records.jsonl")
        elif a.gap_s < -over:
            yield Outcome(False, f"{s.op} {s.index}: rank 0's account ({a.pre_s * 1e3:.1f} ms to its "
                          f"start, {a.own_s:.3f} s its op, {a.post_s * 1e3:.1f} ms to reporting its end) "
                          f"within the witness's {s.answered_s:.3f} s from answering the start",
                          f"{-a.gap_s * 1e3:.1f} ms more than the witness saw", where="records.jsonl")


def witness_host(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome | NotChecked | list[Outcome]:
    """WITNESS-HOST (rules 1.10, disturbed; a result rule, so the runner judges it too and a run
    retried when disturbed is retried for it): the witness's interval exceeds each op by no more
    than the witness can leave untimed.  An honest host that stalled around an op (a tenant, too
    many ranks per core, rank 0 woken late) breaks it; so does a run that recorded its op shorter
    than it was.  Either way the op was not measured to the witness's satisfaction: no result,
    never ranked, and the finding says where rank 0 says the time went."""
    d = ctx.run if isinstance(ctx.run, RunData) else None
    claim = (d.run.get("witness") or {}) if d is not None else {}
    if d is None or claim.get("status") != "witnessed":
        return Outcome(True)
    if d.witness is None:
        return NotChecked("no transcript whose witness signature holds (see WITNESS-SIGNATURE)")
    f = WitnessFacts(claim, True, transcript=d.witness, run=d.run, records=d.records)
    over = float(ruleset.data["witness"]["over_s"])
    out = []
    for a in accounts(f, ruleset):
        if isinstance(a, Account) and a.gap_s >= -over and a.excess_s > a.bound_s:
            s = a.span
            out.append(Outcome(False, f"{s.op} {s.index}: the witness's interval longer than the op by "
                               f"at most {a.bound_s * 1e3:.0f} ms", f"{a.excess_s * 1e3:.0f} ms longer "
                               f"(rank 0: {a.pre_s * 1e3:.0f} ms from the witness's answer to its start, "
                               f"{a.post_s * 1e3:.0f} ms from its end to reporting it; "
                               f"{a.gap_s * 1e3:.0f} ms in transit, the witness's own lag "
                               f"{s.lag_s * 1e3:.0f} ms; an op of {s.duration_s:.3f} s)",
                               where="records.jsonl"))
    return out or Outcome(True)


def too_short(facts: WitnessFacts, ruleset: RuleSet) -> list[dict[str, object]]:
    """The witnessed ops the witness bounds to no better than ``witness.bound_fraction`` of their
    duration (rules 1.10; none before): what the report says of ops too short to bound."""
    if facts.transcript is None or "bound_fraction" not in ruleset.data.get("witness", {}):
        return []
    frac = float(ruleset.data["witness"]["bound_fraction"])
    return [{"op": a.span.op, "index": a.span.index, "duration_s": round(a.span.duration_s, 6),
             "unbounded_s": round(a.bound_s, 6)}
            for a in accounts(facts, ruleset) if isinstance(a,
                                                            Account) and a.bound_s > frac * a.span.duration_s]


def _epoch(stamp: object) -> float | None:
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def witness_clock(facts: WitnessFacts, ruleset: RuleSet) -> Failures:
    skew = float(ruleset.data["witness"]["clock_skew_s"])
    es, run = entries(facts.transcript), facts.run or {}  # type: ignore[arg-type]
    opened, closed = es[0]["t_wall_ns"] / 1e9, es[-1]["t_wall_ns"] / 1e9
    started, ended = _epoch(run.get("started")), _epoch(run.get("ended"))
    if started is None or ended is None or started > opened + skew or ended < closed - skew:
        yield Outcome(False, f"started before the witness's open and ended after its close (± {skew:g} s)",
                      f"started {run.get('started')}, ended {run.get('ended')}; the witness opened "
                      f"{_iso(opened)} and closed {_iso(closed)}", where="run.json")
    for s in spans(facts.transcript, facts.records):  # type: ignore[arg-type]
        if s.wall_start[0] < s.start_wall_s - skew or s.wall_start[1] > s.end_wall_s + skew:
            yield Outcome(False, f"{s.op} {s.index} starting between {_iso(s.start_wall_s)} and "
                          f"{_iso(s.end_wall_s)} (± {skew:g} s)",
                          f"rank wall clocks {_iso(s.wall_start[0])}..{_iso(s.wall_start[1])}",
                          where="records.jsonl")


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


CHECKS: dict[str, CheckFn] = checks_table(
    witness_mode, witness_transcript, witness_signature, witness_trusted,
    witness_host,
    *(_on_transcript(judge) for judge in (witness_run, witness_events, witness_times, witness_clock,
                                          witness_account)))
