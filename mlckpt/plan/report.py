"""Plan reports: the JSON document (`mlckpt plan --json`) and the human-readable text.  Pure (returns data
and strings; the CLI prints them)."""

from __future__ import annotations

from typing import Any

from mlckpt import formats
from mlckpt.rules import Context, Evaluation, host_memory_need, verdict
from mlckpt.units import GiB, fmt_bytes, fmt_bytes_both
from mlckpt.workload.layout import RESTORE_PATTERNS, Plan
from mlckpt.workload.pipeline import Pipeline

PLAN_FORMAT = formats.PLAN.version  # history: mlckpt/formats.py


def rank_ranges(ranks: list[int]) -> str:
    """[0,1,2,3,8,9] → '0-3, 8-9'."""
    out, start, prev = [], None, None
    for r in sorted(ranks):
        if start is None:
            start = prev = r
        elif r == prev + 1:  # type: ignore[operator]
            prev = r
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = r
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(out)


def plan_document(plan: Plan, config: dict[str, Any], ev: Evaluation, ctx: Context) -> dict[str, Any]:
    restore = str(config["checkpoint"]["restore"])
    num_writes = int(config["checkpoint"]["num_writes"])
    pipe = Pipeline.of(config)
    host_rows = None
    if ctx.hosts is not None:  # the HOST-MEMORY rule's own figure (staging, tiers included)
        host_rows = [{"host": h.name, "ranks": len(h.ranks), "resident_bytes": host_memory_need(ctx, h),
                      "available_bytes": h.mem_available_bytes} for h in ctx.hosts]
    return {
        "plan_format": PLAN_FORMAT,
        "rules_version": config["rules_version"],
        "workload": plan.workload.name,
        "division": config["division"],
        "scale": plan.scale,
        "scaled": plan.scale != 1.0,
        "ranks": plan.ranks,
        "tp": plan.tp,
        "pp": plan.pp,
        "dp": plan.dp,
        "zero_stage": plan.zero_stage,
        "parameters": plan.workload.model.num_parameters,
        "model_bytes": plan.model_bytes,
        "optimizer_bytes": plan.optimizer_bytes,
        "total_bytes": plan.total_bytes,
        "total_gib": round(plan.total_bytes / GiB, 2),
        "num_files": plan.num_files,
        "max_rank_bytes": plan.max_rank_bytes,
        "imbalance": round(plan.imbalance, 4),
        "restore_bytes": {p: plan.restore_bytes(p) for p in RESTORE_PATTERNS},
        "max_resident_bytes_per_rank": max(plan.resident_bytes(r, restore)  # type: ignore[arg-type]
                                           for r in range(plan.ranks)),
        "num_writes": num_writes,
        "num_reads": int(config["checkpoint"]["num_reads"]),
        "disk_bytes_needed": plan.total_bytes * num_writes,
        "pipeline": {"mode": pipe.mode, "stages": list(pipe.stages), "fast": pipe.fast,
                     "fast_keep": pipe.fast_keep, "fast_bytes_needed": pipe.fast_peak_checkpoints(num_writes)
                     * plan.total_bytes, "compute_interval_s": pipe.compute_interval_s},
        "hosts": host_rows,
        "verdict": verdict(ev.findings, str(config["division"])),
        "findings": [f.to_dict() for f in ev.findings],
        "not_checked": [{"rule": r, "reason": why} for r, why in ev.not_checked],
        "ranks_detail": [
            {"rank": rp.rank, "tp": rp.tp, "pp": rp.pp, "dp": rp.dp, "bytes": rp.bytes,
             "files": [{"name": f.name, "bytes": f.bytes} for f in rp.files]}
            for rp in plan.rank_plans
        ],
    }


def plan_text(doc: dict[str, Any], plan: Plan, *, files: bool | None = None) -> str:
    w = plan.workload
    lines = [
        f"{doc['workload']} on {doc['ranks']} ranks: TP {doc['tp']} × PP {doc['pp']} × "
        f"DP {doc['dp']}, ZeRO {doc['zero_stage']}, division {doc['division']}"
        + (f", scaled × {doc['scale']}" if doc["scaled"] else "") + f", rules {doc['rules_version']}",
        "",
        f"  parameters          {doc['parameters']:,}",
        f"  model states        {fmt_bytes_both(doc['model_bytes'])}  ({w.model.model_datatype})",
        f"  optimizer states    {fmt_bytes_both(doc['optimizer_bytes'])}  "
        f"({w.model.optimizer_datatype}, 3 copies)",
        f"  checkpoint          {fmt_bytes_both(doc['total_bytes'])}  "
        f"({doc['total_bytes']:,} B in {doc['num_files']} files)",
        f"  per rank            max {fmt_bytes(doc['max_rank_bytes'])}, "
        f"mean {fmt_bytes(doc['total_bytes'] / doc['ranks'])}, imbalance (max/mean) "
        f"{doc['imbalance']:.3f}",
        f"  restore reads       own {fmt_bytes(doc['restore_bytes']['own'])}, repopulate "
        f"{fmt_bytes(doc['restore_bytes']['repopulate'])}",
        f"  resident per rank   max {fmt_bytes(doc['max_resident_bytes_per_rank'])} "
        "(full residency)",
        f"  disk needed         {doc['num_writes']} checkpoints × "
        f"{fmt_bytes(doc['total_bytes'])} = {fmt_bytes_both(doc['disk_bytes_needed'])}",
    ]
    pipe = doc["pipeline"]
    if pipe["stages"] != ["durable"]:
        lines.append(f"  checkpoint mode     {pipe['mode']}: training waits for the {pipe['stages'][0]} "
                     f"stage, then {' → '.join(pipe['stages'][1:])} in the background "
                     f"({pipe['compute_interval_s']:g} s of training per checkpoint)")
    if pipe["fast"] is not None:
        lines.append(f"  fast tier           {pipe['fast']}: up to {fmt_bytes(pipe['fast_bytes_needed'])} "
                     f"at once (keeps the newest {pipe['fast_keep']} once durable)")
    if doc["hosts"]:
        res = [h["resident_bytes"] for h in doc["hosts"]]
        lines.append(f"  memory per host     max {fmt_bytes(max(res))} over {len(res)} hosts")
    groups = plan.layout_groups()
    show_files = files if files is not None else len(groups) <= 8
    lines += ["", f"Layouts ({len(groups)} distinct; names with {{dp}}/{{mp}} vary by rank):"]
    for ranks, rp in groups:
        members = [plan.rank_plans[r] for r in ranks]
        pps = rank_ranges(sorted({m.pp for m in members}))
        dps = rank_ranges(sorted({m.dp for m in members}))
        lines.append(f"  ranks {rank_ranges(ranks)} (pp {pps}, dp {dps}): "
                     f"{len(rp.files)} files, {fmt_bytes(rp.bytes)} each rank")
        if show_files:
            for name, nbytes in rp.layout_key():
                lines.append(f"      {name:<52} {nbytes:>18,} B")
    lines += ["", f"Verdict: {doc['verdict']}"]
    for f in doc["findings"]:
        lines.append(f"  [{f['rule']}] ({f['severity']}) {f['message']}")
    for n in doc["not_checked"]:
        lines.append(f"  not checked: [{n['rule']}] {n['reason']}")
    return "\n".join(lines)
