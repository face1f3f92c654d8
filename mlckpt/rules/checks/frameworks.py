"""Rules 1.11: checkpoints through a training framework's library (mlckpt/workload/frameworks.py).
Pure.

FRAMEWORK-SCOPE (config): what a library writer can run with, refused before any I/O.
FRAMEWORK-RECORDED (result): run.json's framework block is the configuration's; every op names
the writer its checkpoint's round gives; a library's write made at least the planned bytes on
disk in its own files, which were fsynced inside the op by the one run.json names, and it went
through the library (buffered, without the engine's request histogram); an engine op carries
none of a library's fields.  What it cannot see: an engine op relabelled as a library's with
every trace of the engine coherently removed and the file sizes invented (the device counters
still bound the bytes, DEVICE-COUNTERS); a witness does not help, since witnessed runs use the
engine only.
LIBRARY-VERSION (result, rules 1.18): run.json's library version is the one each host's
system.json lists.
FRAMEWORK-TENSORS (result, rules 1.19): a library op's tensor count is the plan's under
``framework.tensors`` (mlckpt/workload/tensors.py); an engine op counts none.  What it cannot see:
a run made flat whose config.yaml and counts were both edited to say model (nothing the library
leaves in the bundle shows how many tensors it wrote; its files are not in the bundle).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from mlckpt.rules.engine import Context, NotChecked, Outcome, Rule, RuleSet, checks_table, rank_shift
from mlckpt.rules.rundata import at, run_data
from mlckpt.workload.frameworks import ENGINE, WRITERS, Framework, scope_problems
from mlckpt.workload.layout import Plan, restore_pattern
from mlckpt.workload.tensors import TensorSpec, tensors_of


def framework_scope(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    bad = scope_problems(ctx.config)
    writer = Framework.of(ctx.config).writer
    return Outcome(not bad, f"framework.writer={writer} without them", "; ".join(bad))


def framework_recorded(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    d = run_data(ctx)
    if "framework" not in d.run:
        yield NotChecked("run.json before format 11 names no writer")
        return
    fw = Framework.of(d.config)
    block = d.run.get("framework")
    if not fw.library:
        if block is not None:
            yield Outcome(False, "framework null (framework.writer=mlckpt)",
                          f"framework {block.get('writer')}")
        for r in d.records:
            if any(k in r for k in ("writer", "file_bytes", "synced_by")):
                yield Outcome(False, "no writer fields on an engine run's records",
                              f"{r['op']} {r['index']} rank {r['rank']} has them")
                return
        return
    want = {"writer": fw.writer, "library": WRITERS[fw.writer].library, "reference": fw.reference,
            "synced_by": fw.synced_by(), "settings": fw.settings()}
    got = {k: (block or {}).get(k) for k in want}
    if got != want:
        yield Outcome(False, f"run.json framework {want}", f"{got}")
        return
    for r in d.records:
        yield from _record(fw, r)


def _record(framework: Framework, r: Mapping[str, Any]) -> Iterator[Outcome]:
    writer = framework.writer_of(int(r["checkpoint"]))
    if r.get("writer") != writer:
        yield Outcome(False, f"checkpoint {r['checkpoint']} by {writer}", f"by {r.get('writer')}",
                      where=at(r))
        return
    if writer == ENGINE:
        if "file_bytes" in r or "synced_by" in r:
            yield Outcome(False, "no library fields on the engine's op", "file_bytes or synced_by",
                          where=at(r))
        return
    if "requests" in r or r.get("direct") or r.get("dontcache"):
        yield Outcome(False, "the library's own buffered I/O (no engine requests, no O_DIRECT)",
                      "the engine's traces", where=at(r))
        return
    if r["op"] != "write":
        return
    file_bytes = r.get("file_bytes")
    if not isinstance(file_bytes, int) or file_bytes < int(r["bytes"]):
        yield Outcome(False, f"the library's files hold at least the {r['bytes']} B planned",
                      f"file_bytes {file_bytes}", where=at(r))
    if r.get("synced_by") != framework.synced_by() or not r.get("fsync"):
        yield Outcome(False, f"every file fsynced inside the op by {framework.synced_by()}",
                      f"synced_by {r.get('synced_by')}, fsync {r.get('fsync')}", where=at(r))


def library_version(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """LIBRARY-VERSION (rules 1.18): the library version run.json's framework block names is the
    one every host's system.json lists for that distribution (a run.json edited alone to claim
    another PyTorch no longer passes; both files edited together still do: RUNNER-RELEASED and an
    auditor are what is left)."""
    d = run_data(ctx)
    block = d.run.get("framework")
    if not block or not block.get("library"):
        yield NotChecked("not a library run")
        return
    library, claimed = str(block["library"]), block.get("library_version")
    for h in d.system.get("hosts") or ():
        have = (h.get("packages") or {}).get(library)
        if have != claimed:
            yield Outcome(False, f"{library} {claimed} (run.json) on host {h.get('hostname')}",
                          f"{library} {have} (system.json)" if have else f"no {library} in system.json")


def framework_tensors(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """FRAMEWORK-TENSORS (rules 1.19): every library op handled the tensors the plan gives its
    rank under the configured structure (a write: its own files'; a restore: the files it read,
    as their writers handed them), and no engine op claims any."""
    d, plan = run_data(ctx), ctx.plan
    fw = Framework.of(d.config)
    if plan is None or not fw.library:
        yield NotChecked("not a library run" if plan is not None else "no plan")
        return
    count = _TensorCount(plan, fw.tensors, str(d.config["checkpoint"]["restore"]),
                         int(d.run.get("rank_shift", rank_shift(ctx))))
    for r in d.records:
        rank, claimed = int(r["rank"]), r.get("tensors")
        if r.get("writer", ENGINE) == ENGINE:
            if claimed is not None:
                yield Outcome(False, "no tensors counted on the engine's op", f"tensors {claimed}",
                              where=at(r))
        elif 0 <= rank < plan.ranks:  # another rank is BYTES-PLAN's to name
            want = count(r["op"] == "write", rank)
            if claimed != want:
                yield Outcome(False, f"{want} tensors (framework.tensors={fw.tensors})", f"{claimed}",
                              where=at(r))


class _TensorCount:
    """The tensors a rank's library write or restore handles, by the plan (made once per rank)."""

    def __init__(self, plan: Plan, structure: str, restore: str, shift: int) -> None:
        self.plan, self.structure, self.shift = plan, structure, shift
        self.pattern = restore_pattern(restore)
        self.files: dict[int, tuple[tuple[TensorSpec, ...], ...]] = {}
        self.counts: dict[tuple[bool, int], int] = {}

    def _of(self, rank: int) -> tuple[tuple[TensorSpec, ...], ...]:
        if rank not in self.files:
            self.files[rank] = tensors_of(self.plan, rank, self.structure)
        return self.files[rank]

    def __call__(self, write: bool, rank: int) -> int:
        if (write, rank) not in self.counts:
            if write:
                n = sum(len(ts) for ts in self._of(rank))
            else:
                reads = self.plan.restore_reads(rank, self.pattern, self.shift)
                n = sum(len(self._of(rd.writer)[rd.index]) for rd in reads)
            self.counts[(write, rank)] = n
        return self.counts[(write, rank)]


CHECKS = checks_table(framework_scope, framework_recorded, library_version, framework_tensors)
