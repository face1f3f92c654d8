"""One run's documents as the rules read them: run.json, config.yaml, summary.json, system.json,
records.jsonl and a witness's transcript, parsed once into a :class:`RunData` that the runner's
publish, the checker, the report's recomputation and the leaderboard share, with what every result
rule asks of them made once (the records' grouping by op and by host, their summary).  Pure.

The result-stage checks (``mlckpt/rules/checks/``) see it through ``Context.run``; code outside
``mlckpt/rules`` takes it from :mod:`mlckpt.rules`, never from the checks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from mlckpt import formats, latency
from mlckpt.metrics import group_ops, summarize
from mlckpt.rules.engine import Context, RuleSet
from mlckpt.workload.pipeline import Pipeline
from mlckpt.written import Written

# The data scheme the runner declares in run.json; see mlckpt/engine/content.py (AES-128-CTR keystream per
# run/rank/checkpoint/file, 32-byte tag on every 4 KiB page).
DATA_SCHEME = formats.DATA_SCHEME.version


@dataclass(frozen=True)
class RunData:
    run: Mapping[str, Any]
    config: Mapping[str, Any]
    summary: Mapping[str, Any]
    records: Sequence[Mapping[str, Any]]
    system: Mapping[str, Any] = field(default_factory=dict)
    # The witness's transcript (its document, its signature held), for a witnessed run's
    # WITNESS-HOST (rules 1.10): None without a witness or one that could not be opened.
    witness: Mapping[str, object] | None = None
    # summarize() of the records, computed once for every rule (and report) that needs it
    _summaries: dict[tuple[float, int, int], dict[str, object]] = field(default_factory=dict, compare=False,
                                                                repr=False)
    # what each request histogram holds that the request rules ask (its longest request, the least
    # its requests add up to), found while summarizing (mlckpt.latency.merged): the rules read it
    # rather than decode a block again; never summarized for it, since records the summary cannot
    # be recomputed from (the checker skips those rules) must not fault
    blocks: latency.Seen = field(default_factory=dict, compare=False, repr=False)
    _grouped: dict[tuple[str, int], list[Mapping[str, object]]] = field(default_factory=dict, compare=False,
                                                                      repr=False)
    _hosts: dict[int, tuple[Sequence[Mapping[str, object]], dict[str, list[Mapping[str, object]]]]] = field(
        default_factory=dict, compare=False, repr=False)
    # what else is made once for every rule that asks (the recomputed summary.json), by key
    _made: dict[object, object] = field(default_factory=dict, compare=False, repr=False)

    def summarized(self, ruleset: RuleSet) -> dict[str, object]:
        """The statistics of the records (``mlckpt.metrics.summarize``), under ``ruleset``'s cold-read
        bound and the records' own format; shared, not to be changed."""
        key = (float(ruleset.data["cold_read"]["max_resident_fraction"]),
               int(self.run.get("records_format", formats.RECORDS.version)), summary_format(ruleset))
        if key not in self._summaries:
            self._summaries[key] = summarize(self.records, max_resident_fraction=key[0],
                                             records_format=key[1], summary_format=key[2],
                                             seen=self.blocks, grouped=self.grouped())
        return self._summaries[key]

    def once(self, key: object, make: Callable[[], Any]) -> Any:
        """``make()``, made the first time ``key`` is asked for; shared, not to be changed."""
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    @cached_property
    def pipeline(self) -> Pipeline:
        """The configuration's pipeline, made once (per-record checks ask it for every record)."""
        return Pipeline.of(self.config)

    def grouped(self) -> dict[tuple[str, int], list[Mapping[str, Any]]]:
        """``mlckpt.metrics.group_ops`` of the records, made once for every rule; not to be changed."""
        if not self._grouped:
            self._grouped.update(group_ops(self.records))
        return self._grouped

    def hosts(self, recs: Sequence[Mapping[str, Any]] | None = None) -> dict[str, list[Mapping[str, Any]]]:
        """The records (by default all of them; else one of :meth:`grouped`'s lists) by host, in
        their order: made once per list for every rule; not to be changed."""
        recs = self.records if recs is None else recs
        hit = self._hosts.get(id(recs))
        if hit is None or hit[0] is not recs:  # the list is kept with its grouping: its id stays its own
            hit = self._hosts[id(recs)] = (recs, by_host(recs))
        return hit[1]

    def ops(self, op: str) -> dict[int, list[Mapping[str, Any]]]:
        """The records of each ``op`` op by index: :meth:`grouped`'s lists (rank order); not to be changed."""
        return {idx: recs for (kind, idx), recs in self.grouped().items() if kind == op}


def at(r: Mapping[str, object]) -> str:
    """Where a finding about one record is: its op, index and rank (made only for a finding: the
    per-record checks pass over tens of thousands of records)."""
    return f"{r['op']} {r['index']} rank {r['rank']}"


def by_host(recs: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """The records by host, in their order."""
    out: dict[str, list[Mapping[str, object]]] = {}
    for r in recs:
        out.setdefault(str(r["host"]), []).append(r)
    return out


def written(data: RunData) -> int:
    """The checkpoints the restores cycle through: this run's writes, or for a read-only
    invocation (run format 4) those of the write invocation it restored."""
    source = data.run.get("restored_from") or {}
    # At least 1: a bundle claiming no writes and restores anyway fails COUNTS-POSITIVE; the
    # other rules must still judge its records, not divide by zero.
    return max(1, int(source.get("num_writes") or data.config["checkpoint"]["num_writes"] or 0))


def summary_format(ruleset: RuleSet) -> int:
    """The summary format a rule set's bundles carry (its summary schema's ``summary_format``)."""
    return Written.of(ruleset.version).summary


def run_data(ctx: Context) -> RunData:
    """The run's data; every result rule declares ``needs: [run]``, so the engine never calls a
    check without it (a rule that forgot the need is a defect of the rules data)."""
    if not isinstance(ctx.run, RunData):
        raise TypeError("a result-stage rule was evaluated without run data: declare needs: [run]")
    return ctx.run
