"""What resuming at another scale asks of the storage, answered without I/O (``mlckpt plan
--resume-at``, ``mlckpt size --resume-at``): each new rank's state, the byte ranges it needs of which
old files, what it reads in whole pages, and the time the storage alone needs for it.  Pure."""

from __future__ import annotations

from typing import Any

from mlckpt.units import fmt_bytes
from mlckpt.workload.layout import Plan
from mlckpt.workload.resume import (
    ResumePlan,
    checkpoint_index,
    distinct_piece_bytes,
    resume_plan,
    stored_pieces,
)


def plan_resume(plan: Plan, ranks: int, tp: int | None, pp: int | None) -> ResumePlan:
    """The resume at ``ranks`` (TP ``tp``, PP ``pp``: the written layout's where None) of the
    checkpoint ``plan`` writes (ConfigError naming the key where it cannot be)."""
    return resume_plan(checkpoint_index(plan), plan.workload, ranks, tp or plan.tp, pp or plan.pp)


def resume_document(plan: Plan, new: ResumePlan) -> dict[str, Any]:
    groups: dict[tuple[int, int, int, int, int], list[int]] = {}
    for rr, reads in zip(new.rank_resumes, new.reads, strict=True):
        files = len({(r.writer, r.index) for r in reads})
        key = (rr.bytes, len(rr.tensors), len(rr.needs), len(reads), files)
        groups.setdefault(key, []).append(rr.rank)
    return {
        "written": {"ranks": plan.ranks, "tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "zero": plan.zero_stage,
                    "bytes": plan.total_bytes, "files": plan.num_files},
        "resumed": {"ranks": new.ranks, "tp": new.tp, "pp": new.pp, "dp": new.dp},
        "index_bytes": len(new.index.to_json()), "tensors": len(new.index.tensors),
        "state_bytes": new.state_bytes, "read_bytes": new.read_bytes,
        "amplification": new.read_bytes / max(1, new.state_bytes),
        "ranks": [{"ranks": ranks, "bytes": k[0], "tensors": k[1], "ranges": k[2], "reads": k[3],
                   "old_files": k[4]} for k, ranks in groups.items()],
        "whole_pieces": _whole_pieces(plan, new),
    }


def _whole_pieces(plan: Plan, new: ResumePlan) -> dict[str, Any]:
    """What a library that reads every stored piece a new shard overlaps whole (DCP) reads: by the
    ranks, and distinct (what the storage serves where every rank shares one page cache)."""
    whole = resume_plan(new.index, plan.workload, new.ranks, new.tp, new.pp, spread=False)
    pieces = [stored_pieces(new.index, rr) for rr in whole.rank_resumes]
    read = sum(p[3] for ps in pieces for p in ps)
    return {"pieces": sum(len(ps) for ps in pieces), "read_bytes": read,
            "amplification": read / max(1, whole.state_bytes),
            "distinct_bytes": distinct_piece_bytes(whole, range(whole.ranks))}


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    shown = ", ".join(str(r) for r in ranks[:4])
    return f"ranks {shown}{', ...' if len(ranks) > 4 else ''} ({len(ranks)})"


def resume_text(doc: dict[str, Any]) -> str:
    w, r = doc["written"], doc["resumed"]
    lines = [f"resume at {r['ranks']} ranks (TP {r['tp']}, PP {r['pp']}, DP {r['dp']}) of the checkpoint "
             f"written at {w['ranks']} (TP {w['tp']}, PP {w['pp']}, DP {w['dp']}, ZeRO {w['zero']}): "
             f"{fmt_bytes(w['bytes'])} in {w['files']:,} files",
             f"  index: {doc['tensors']:,} global tensors, {fmt_bytes(doc['index_bytes'])} "
             "(every new rank reads it)",
             f"  state placed: {fmt_bytes(doc['state_bytes'])}; read in whole pages: "
             f"{fmt_bytes(doc['read_bytes'])} ({doc['amplification']:.3f}x)"]
    for g in doc["ranks"]:
        each = " each" if len(g["ranks"]) > 1 else ""
        lines.append(f"  {_ranks(g['ranks'])}: {fmt_bytes(g['bytes'])}{each}, {g['tensors']:,} tensors from "
                     f"{g['ranges']:,} byte ranges of {g['old_files']} old files, read as "
                     f"{g['reads']:,} ranges")
    w = doc["whole_pieces"]
    lines.append(f"  through DCP (every stored piece a shard overlaps, read whole): {w['pieces']:,} pieces, "
                 f"{fmt_bytes(w['read_bytes'])} read by the ranks ({w['amplification']:.3f}x), "
                 f"{fmt_bytes(w['distinct_bytes'])} of them distinct (the storage's part where the ranks "
                 "share one page cache)")
    return "\n".join(lines)


def resume_time_s(doc: dict[str, Any], bandwidth_bytes_s: float) -> float:
    """The storage's part of a resume: every rank's index and page-rounded reads at ``bandwidth``
    (its aggregate read rate).  A lower bound: planning and placing cost CPU on top
    (docs/src/measurements/resume.md gives measured ratios)."""
    return (doc["read_bytes"] + doc["resumed"]["ranks"] * doc["index_bytes"]) / bandwidth_bytes_s
