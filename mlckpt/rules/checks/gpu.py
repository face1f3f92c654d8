"""Check functions of runs whose state lives in GPU memory (rules 1.7, ``state.source=gpu``): what
such a run may be (config), whether every host can hold it (host), and whether the bundle states
the source and its copies hold up against the rates each rank measured (result).  Pure: the
runner measures, these judge."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from mlckpt.rules.checks.objects import beyond_one_tier
from mlckpt.rules.engine import Context, NotChecked, Outcome, Rule, RuleSet, checks_table
from mlckpt.rules.rundata import at, run_data


def gpu_source(config: Mapping[str, object]) -> bool:
    """Whether a configuration keeps the state in GPU memory (rules 1.7's ``state.source``)."""
    state = config.get("state") or {}
    return isinstance(state, Mapping) and state.get("source") == "gpu"


def gpu_modes(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    """GPU-MODES: sync or async on one tier of files, full residency, one invocation, no witness
    (a witnessed write restamps the host buffer's tags, which the GPU source wipes)."""
    if not gpu_source(ctx.config):
        return Outcome(True)
    bad = beyond_one_tier(ctx, objects=True)
    return Outcome(not bad, "one tier of files, residency=full, one invocation, no witness", ", ".join(bad))


def gpu_usable(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome]:
    if not gpu_source(ctx.config):
        yield Outcome(True)
        return
    for h in ctx.hosts or ():  # needs: [host_measurements]
        yield Outcome(h.gpu_problem is None, "usable", h.gpu_problem, where=f"host {h.name}")


def gpu_source_recorded(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """The state block agrees with the configuration; every rank held its shard on a CUDA device;
    every write and read record of a GPU run carries its device copy, inside the op (inside the
    memory stage of an async write), no faster than ``copy_rate_multiple`` × that rank's probe."""
    d = run_data(ctx)
    if "state" not in d.run:
        yield NotChecked("run.json has no state block (run format 6 or older)")
        return
    block, want = d.run.get("state"), gpu_source(d.config)
    if not want:
        got = f"state.source={block.get('source')!r}" if isinstance(block, Mapping) else f"{block!r}"[:80]
        yield Outcome(block is None, "state: null (host memory)", got, where="run.json")
        yield from _no_device_copies(d.records)
        return
    if not isinstance(block, Mapping) or block.get("source") != "gpu":
        yield Outcome(False, "state.source='gpu'", f"{block!r}"[:80], where="run.json")
        return
    ranks = {int(r["rank"]): r for r in block.get("ranks", [])}
    yield Outcome(sorted(ranks) == list(range(int(d.config.get("ranks", 0)))),
                  "one entry for every rank", f"{len(ranks)} entries", where="run.json state.ranks")
    for rank, entry in sorted(ranks.items()):
        yield Outcome(entry.get("device_type") == "cuda", "a CUDA device",
                      f"{entry.get('device_type')} ({entry.get('device_name')})", where=f"rank {rank}")
    for h in d.system.get("hosts", []):  # the hosts' own facts name the devices the ranks claim
        g = h.get("gpus") or {}
        names = sorted({str(e.get("device_name")) for e in ranks.values()
                        if e.get("host") == h.get("hostname")})
        yield Outcome(g.get("device_type") == "cuda" and set(names) <= set(g.get("names") or ()),
                      f"CUDA devices {names}", f"{g.get('device_type')} {g.get('names')}",
                      where=f"host {h.get('hostname')}")
    multiple = float(ruleset.data.get("gpu_evidence", {}).get("copy_rate_multiple", 1.5))
    for r in d.records:
        yield from _copy_evidence(r, ranks.get(int(r["rank"]), {}), multiple)


def _no_device_copies(records: Any) -> Iterator[Outcome]:
    for r in records:
        if "device_copy_ns" in r:
            yield Outcome(False, "no device copies in a run with its state in host memory",
                          "device_copy_ns", where=at(r))
            return


def _copy_evidence(r: Mapping[str, Any], entry: Mapping[str, Any], multiple: float) -> Iterator[Outcome]:
    copy = r.get("device_copy_ns")
    if not isinstance(copy, int):
        yield Outcome(False, "device_copy_ns on the record", "none", where=at(r))
        return
    inside = int(r["t1_ns"]) - int(r["t0_ns"])
    memory = [s for s in r.get("stages", ()) if s.get("tier") == "memory"]
    if memory:  # async: the memory stage is the copy itself
        inside = int(memory[0]["t1_ns"]) - int(memory[0]["t0_ns"])
    if copy > inside:
        yield Outcome(False, f"at most the {'memory stage' if memory else 'op'} ({inside / 1e6:.1f} ms)",
                      f"{copy / 1e6:.1f} ms", where=at(r))
    probe = entry.get("d2h_gib_s" if r["op"] == "write" else "h2d_gib_s")
    if isinstance(probe, int | float) and probe > 0:
        rate = int(r["bytes"]) / max(copy, 1) * 1e9 / 2**30
        yield Outcome(rate <= multiple * probe, f"a copy at most {multiple:g}× the rank's {probe:g} GiB/s",
                      f"{rate:.1f} GiB/s", where=at(r))


CHECKS = checks_table(gpu_modes, gpu_usable, gpu_source_recorded)
