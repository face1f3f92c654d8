"""Check functions of the ``host`` stage: each host's measured memory, space and folders against
what its ranks need.  Pure: the runner measures, these judge."""

from __future__ import annotations

from collections.abc import Iterator

from mlckpt.rules.engine import (
    Context,
    HostSpec,
    NotChecked,
    Outcome,
    Rule,
    RuleSet,
    checks_table,
    rank_shift,
)
from mlckpt.units import fmt_bytes
from mlckpt.workload.layout import Plan
from mlckpt.workload.pipeline import MEMORY_FILESYSTEMS, Pipeline


def closed_ranks_per_host(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    minimum = ruleset.closed["min_ranks_per_host"]
    for h in ctx.hosts or ():  # needs: [hosts]
        yield Outcome(len(h.ranks) >= minimum, minimum, f"host {h.name} has {len(h.ranks)}")


def host_memory(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    for h in ctx.hosts or ():  # needs: [plan, hosts]
        if h.mem_available_bytes is None:
            yield NotChecked("host memory unknown (give host_memory_gib=)")
            continue
        need = host_memory_need(ctx, h)
        got = f"{fmt_bytes(h.mem_available_bytes)} available"
        # the remedy, where one fits and no other rule forbids it (an async run stays resident)
        if need > h.mem_available_bytes and ctx.get("residency") != "stream" and \
                str(ctx.get("checkpoint.mode") or "sync") == "sync":
            streamed = host_memory_need(ctx, h, stream=True)
            if streamed <= h.mem_available_bytes:
                got += f"; residency=stream would fit (it needs {fmt_bytes(streamed)})"
        yield Outcome(h.mem_available_bytes >= need, fmt_bytes(need), got, where=f"host {h.name}")


def memory_folder(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """Restores are cold reads from storage: a checkpoint folder in memory (tmpfs, ramfs) has
    nothing to read cold from, known before the first byte is written (rules 1.9)."""
    if not int(ctx.get("checkpoint.num_reads") or 0):
        return  # a write-only invocation reads nothing
    yield from _folder_not_in_memory(ctx)


def memory_folder_reads(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """Rules 1.14: :func:`memory_folder`, and a serving run, which always reads its weights back
    (1.13 read ``checkpoint.num_reads``, which a serving run leaves at 0)."""
    if ctx.kind == "serving" or int(ctx.get("checkpoint.num_reads") or 0):
        yield from _folder_not_in_memory(ctx)


def _folder_not_in_memory(ctx: Context) -> Iterator[Outcome | NotChecked]:
    for h in ctx.hosts or ():
        if h.folder_fs is None:
            yield NotChecked("the checkpoint folder's filesystem was not measured")
            continue
        yield Outcome(h.folder_fs not in MEMORY_FILESYSTEMS, "a checkpoint folder on storage",
                      f"{ctx.get('checkpoint.folder')} on {h.folder_fs}", where=f"host {h.name}")


def host_memory_need(ctx: Context, host: HostSpec, *, stream: bool | None = None) -> int:
    """Memory the ranks of ``host`` need: each rank's state (full residency: its shard or what it
    restores, whichever is larger; stream: the ring), plus async staging (a copy of its shard) and
    the drain's ring when tiered, plus the fast tier itself when it lives in this memory (tmpfs)."""
    plan = ctx.plan
    assert plan is not None
    restore = str(ctx.get("checkpoint.restore") or "own")
    stream = ctx.get("residency") == "stream" if stream is None else stream
    cap = int(ctx.get("stream_buffer_bytes") or 0)
    shift = rank_shift(ctx)
    pipe = Pipeline.of(ctx.config)
    ring = pipe.drain_ring_bytes(int(ctx.get("io.threads") or 1), int(ctx.get("io.block_size") or 0))
    need = 0
    for r in host.ranks:
        state = plan.resident_bytes(r, restore, shift)  # type: ignore[arg-type]
        need += min(cap, state) if stream else state
        need += pipe.staging_bytes(plan.own_resident_bytes(r)) + ring
    if pipe.tiered and host.fast_fs in MEMORY_FILESYSTEMS:
        need += pipe.fast_peak_checkpoints(int(ctx.get("checkpoint.num_writes") or 1)) \
            * host_checkpoint_bytes(plan, host)
    return need


def host_checkpoint_bytes(plan: Plan, host: HostSpec) -> int:
    """Bytes the ranks of ``host`` write per checkpoint, in whole pages (what a node-local tier holds)."""
    return sum(plan.own_resident_bytes(r) for r in host.ranks)


def disk_space(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    assert ctx.plan is not None  # needs: [plan, host_measurements]
    need = ctx.plan.total_bytes * int(ctx.get("checkpoint.num_writes") or 0)
    for h in ctx.hosts or ():
        if h.disk_free_bytes is None:
            yield NotChecked("free space not measured")
            continue
        yield Outcome(h.disk_free_bytes >= need, fmt_bytes(need),
                      f"{fmt_bytes(h.disk_free_bytes)} free", where=f"host {h.name}")


def folder_usable(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    for h in ctx.hosts or ():  # needs: [host_measurements]
        yield Outcome(h.folder_problem is None, "writable, no foreign files", h.folder_problem,
                      where=f"host {h.name}")


def results_apart(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """Checkpoints and results on different filesystems (MLPerf Storage keeps them apart): the
    results' writes must not share the storage under test."""
    for h in ctx.hosts or ():  # needs: [host_measurements]
        if h.results_same_fs is None:
            yield NotChecked(f"host {h.name}: not measured")
        else:
            yield Outcome(not h.results_same_fs, "the checkpoint folder and output.root on different "
                          "filesystems", "one filesystem", where=f"host {h.name}")


def tier_space(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    pipe = Pipeline.of(ctx.config)
    if not pipe.tiered:
        yield Outcome(True)  # one tier: nothing to check
        return
    assert ctx.plan is not None  # needs: [plan, host_measurements]
    peak = pipe.fast_peak_checkpoints(int(ctx.get("checkpoint.num_writes") or 1))
    for h in ctx.hosts or ():
        if h.fast_free_bytes is None:
            yield NotChecked("fast-tier free space not measured")
            continue
        need = peak * host_checkpoint_bytes(ctx.plan, h)
        held = f"{peak} checkpoint{'s' if peak > 1 else ''}"
        yield Outcome(h.fast_free_bytes >= need, f"{fmt_bytes(need)} ({held})",
                      f"{fmt_bytes(h.fast_free_bytes)} free", where=f"host {h.name}")


def tier_usable(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    if not Pipeline.of(ctx.config).tiered:
        yield Outcome(True)  # one tier: nothing to check
        return
    for h in ctx.hosts or ():  # needs: [host_measurements]
        yield Outcome(h.fast_problem is None, "writable, no foreign files", h.fast_problem,
                      where=f"host {h.name}")



def io_engine(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome]:
    """The I/O mode asked for must work on every host's checkpoint filesystem, as probed there."""
    folder = ctx.get("checkpoint.folder")
    for h in ctx.hosts or ():
        if ctx.get("io.direct") and h.direct_ok is False:
            yield Outcome(False, "O_DIRECT (io.direct=true; use io.direct=false on e.g. tmpfs)",
                          f"refused at {folder}", where=f"host {h.name}")
        elif ctx.get("io.dontcache") and h.dontcache_ok is False:
            yield Outcome(False, "RWF_DONTCACHE (io.dontcache=true; Linux 6.14+ and filesystem support)",
                          f"not supported at {folder}", where=f"host {h.name}")
        else:
            yield Outcome(True)


def host_clock_offset(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    bound = float(ruleset.data["clocks_gate"]["max_offset_s"])
    for h in ctx.hosts or ():  # needs: [host_measurements]
        if h.clock_offset_s is None:
            yield NotChecked(f"host {h.name}: not measured")
        else:
            yield Outcome(abs(h.clock_offset_s) <= bound, f"within {bound:g} s of rank 0's host",
                          f"{h.clock_offset_s:+.3f} s", where=f"host {h.name}")


CHECKS = checks_table(
    host_clock_offset,
    io_engine,
    closed_ranks_per_host,
    host_memory,
    memory_folder,
    memory_folder_reads,
    disk_space,
    folder_usable,
    results_apart,
    tier_space,
    tier_usable,
)
