"""DLIO or mlpstorage result folders: one side of ``mlckpt-check compare``, and what
``mlckpt-check import`` lists.  Unverified.

A result is a timestamp folder (one invocation), or a workload folder holding the two timestamp
folders of a split result (the write invocation and the read invocation, joined as one result: write
figures from the one, read figures from the other).  Such a folder holds DLIO's ``summary.json``
(its ``metric`` block, ``num_accelerators``, ``num_hosts``, ``start``), and under mlpstorage a
``*_metadata.json`` (the model, the process count, the checkpoint parameters) and DLIO's
``dlio_config/config.yaml``.  Nothing in it is signed or recomputable: DLIO times rank 0, does not
control the page cache and verifies nothing, so a result is labelled unverified and every figure
is quoted as the folder states it.  Files are read with the same bounded strict loaders as
bundles; a folder that is neither is one line, exit 2.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from checker.leaderboard import BundleDocs
from mlckpt import strict as loading
from mlckpt.errors import ExitStatus, UsageError
from mlckpt.plan.aliases import WORKLOADS
from mlckpt.units import GiB

LABEL = "DLIO / mlpstorage result folder, UNVERIFIED: rank 0's timing, page cache not controlled"
# The compare rows such a folder states (others are blank: never guessed); the counts only when
# mlpstorage's metadata gives them.
STATED = {"workload", "division", "ranks", "hosts", "checkpoint_gib", "restore_gib", "verification",
          *(f"{op}_{what}" for op in ("write", "read")
            for what in ("bandwidth_mean_gib_s", "bandwidth_stdev_gib_s", "duration_mean_s"))}
_MAX_BYTES = 1 << 20  # summary.json: a few KB
# mlpstorage's metadata grows with the hosts, about 43 KB each (684 KB at 16 hosts, about 6 MB at
# the 128 of the largest published result): 64 MiB holds 1,500 hosts.
_MAX_METADATA_BYTES = 64 << 20
_MAX_DEPTH = 8  # a whole tree: <division>/<org>/results/<system>/checkpointing/<model>/<ts>


def _invocations(path: Path) -> list[Path]:
    """The timestamp folders directly under ``path`` that hold DLIO's summary.json."""
    try:
        return sorted(p for p in path.iterdir() if p.is_dir() and (p / "summary.json").is_file())
    except OSError:
        return []


def is_foreign(path: Path) -> bool:
    """A folder holding DLIO's summary.json, or timestamp folders holding it (a published workload
    folder: one invocation, or the two invocations of a split result)."""
    return path.is_dir() and ((path / "summary.json").is_file() or bool(_invocations(path)))


def results_under(path: Path) -> list[Path]:
    """Every folder at or below ``path`` holding DLIO's summary.json, at any level of a
    published tree (a timestamp folder, a workload, a system, a submitter), sorted."""
    found: list[Path] = []
    stack = [(path, 0)]
    while stack:
        here, depth = stack.pop()
        if (here / "summary.json").is_file():
            found.append(here)
            continue
        if depth < _MAX_DEPTH:
            try:
                stack += [(p, depth + 1) for p in here.iterdir() if p.is_dir() and not p.is_symlink()]
            except OSError:
                continue
    return sorted(found)


def _json(path: Path, what: str, cap: int = _MAX_BYTES) -> Any:
    try:
        return loading.parse_json(loading.read_capped(path, cap))
    except (OSError, loading.ParseError) as exc:
        raise UsageError(f"{what} {path}: {exc}") from None


def _number(doc: Mapping[str, object], key: str) -> float | None:
    v = doc.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _metadata(folder: Path, which: str) -> Mapping[str, object]:
    found = sorted(folder.glob("*_metadata.json"))
    doc = _json(found[0], which, _MAX_METADATA_BYTES) if found else {}
    return doc if isinstance(doc, Mapping) else {}


def load_foreign(folder: Path, which: str) -> BundleDocs:
    """The result's figures in the shape ``compare`` reads, marked unverified: one invocation (its
    own folder, or the one timestamp folder of a workload folder), or a split result's two
    invocations joined."""
    if (folder / "summary.json").is_file():
        return _one(folder, which)
    found = _invocations(folder)
    if len(found) == 1:  # a workload folder published with one invocation
        return _one(found[0], which)
    invocations = [_one(h, which) for h in found]
    writes = [d for d in invocations if "write_bandwidth_mean_gib_s" in d.summary]
    reads = [d for d in invocations if "read_bandwidth_mean_gib_s" in d.summary]
    if len(invocations) != 2 or len(writes) != 1 or len(reads) != 1 or writes[0] is reads[0]:
        raise UsageError(f"{which} {folder}: not one result (a split result is a write invocation and a "
                         "read invocation side by side); `mlckpt-check import` lists what is there")
    w, r = writes[0], reads[0]
    summary = {**w.summary, **{k: v for k, v in r.summary.items() if k.startswith(("read_", "num_reads",
                                                                               "restore_"))}}
    run = {**w.run, "name": folder.name, "stated": sorted(set(w.run["stated"]) | set(r.run["stated"]))}
    return BundleDocs(run, w.config, summary, w.system, "", "", None)


def _one(folder: Path, which: str) -> BundleDocs:
    summary = _json(folder / "summary.json", which)
    metric = summary.get("metric") if isinstance(summary, Mapping) else None
    if not isinstance(metric, Mapping) or not isinstance(_number(metric, "checkpoint_size_GB"), float):
        raise UsageError(f"{which} {folder}: neither an mlckpt bundle nor a DLIO checkpointing result "
                         "(summary.json has no metric block with checkpoint_size_GB)")
    meta = _metadata(folder, which)
    args = loading.mapping_at(meta, "args")
    params = loading.mapping_at(meta, "parameters")
    ck = loading.mapping_at(params, "checkpoint")
    model = str(args.get("model") or meta.get("model") or "unknown")
    ranks = int(_number(summary, "num_accelerators") or _number(meta, "num_processes") or 0)
    hosts = int(_number(summary, "num_hosts") or 0)
    out: dict[str, object] = {"checkpoint_bytes": int(float(metric["checkpoint_size_GB"]) * GiB),
                           "restore_bytes": 0, "read_verified": False, "num_writes": 0, "num_reads": 0}
    stated = set(STATED)
    for ours, theirs in (("write", "save"), ("read", "load")):
        mean = _number(metric, f"{theirs}_checkpoint_io_mean_GB_per_second")
        if mean is None:
            continue
        count = _number(ck, f"num_checkpoints_{ours}")
        if count:
            out[f"num_{ours}s"] = int(count)
            stated.add(f"num_{ours}s")
        out[f"{ours}_bandwidth_mean_gib_s"] = mean  # DLIO's "GB" are GiB
        out[f"{ours}_bandwidth_stdev_gib_s"] = _number(metric, f"{theirs}_checkpoint_io_stdev_GB_per_second")
        out[f"{ours}_duration_mean_s"] = _number(metric, f"{theirs}_checkpoint_duration_mean_seconds")
    if "read_bandwidth_mean_gib_s" in out:
        out["restore_bytes"] = out["checkpoint_bytes"]
    run = {"run_id": "—", "name": folder.name, "workload": WORKLOADS.get(model, model), "ranks": ranks,
           "hosts": [{"host": f"host {i}", "ranks": []} for i in range(hosts)], "scale": 1.0,
           "division": str(meta.get("verification") or "—").lower(), "rules_version": "",
           "system_name": None, "verdict": None, "started": summary.get("start"), "stated": sorted(stated)}
    config = {"workload": {"name": run["workload"]}, "io": {}, "residency": "full",
              "checkpoint": {"restore": "own", "fsync": bool(ck.get("fsync", False)), "mode": "sync",
                             "tiers": {"fast": None, "fast_keep": 0},
                             "compute_interval_s": _number(ck, "time_between_checkpoints") or 0.0}}
    return BundleDocs(run, config, out, {"hosts": []}, "", "", None)


# ----------------------------------------------------------------------------------------------
# mlckpt-check import PATH: every published result under a path, read or not


def import_rows(path: Path) -> tuple[list[dict[str, object]], list[tuple[str, str]]]:
    """(one row per result read, (folder, why) per folder that could not be): every timestamp
    folder under ``path``; the two invocations of a split result, side by side, as one result."""
    results, problems = read_results(path)
    return [_row(target, docs, invocations) for target, docs, invocations in results], problems


def read_results(path: Path) -> tuple[list[tuple[Path, BundleDocs, int]], list[tuple[str, str]]]:
    """((folder, its figures, invocations) per result read, (folder, why) per folder that could not be)."""
    rows: list[tuple[Path, BundleDocs, int]] = []
    problems: list[tuple[str, str]] = []
    done: set[Path] = set()
    for folder in results_under(path):
        if folder in done:
            continue
        found = _invocations(folder.parent)
        docs, target = None, folder
        if len(found) == 2:  # a split result, if it reads as one
            try:
                docs, target = load_foreign(folder.parent, "import"), folder.parent
                done.update(found)
            except UsageError:
                docs = None
        if docs is None:
            try:
                docs = load_foreign(folder, "import")
            except UsageError as exc:
                problems.append((str(folder), str(exc).split(f"{folder}: ", 1)[-1]))
                continue
        rows.append((target, docs, 2 if target != folder else 1))
    return rows, problems


def published_entries(path: Path) -> tuple[list[Any], list[tuple[str, str]]]:
    """Leaderboard entries, marked unverified, for every result published under ``path`` (any
    level of ``<division>/<org>/results/<system>/checkpointing/<model>/<timestamp>``), and what
    could not be read.  Organisation, system and division come from the published tree's folder
    names where the path has them."""
    from dataclasses import replace

    from checker.leaderboard.model import entry_from_docs

    results, problems = read_results(path)
    out = []
    for target, docs, _ in results:
        parts = target.resolve().parts
        org = system = "—"
        division = str(docs.run["division"])
        if "results" in parts[:-1] and parts.index("results") >= 1:
            i = parts.index("results")
            org, system = parts[i - 1], parts[i + 1]
            if i >= 2 and parts[i - 2].lower() in ("closed", "open"):
                division = parts[i - 2].lower()
        entry = entry_from_docs(str(target.resolve()), org, system, docs.run, docs.config, docs.summary,
                                docs.system, division=division)
        out.append(replace(entry, run_id=str(docs.run["name"]), unverified=True))
    return out, problems


def _row(target: Path, docs: BundleDocs, invocations: int) -> dict[str, object]:
    s = docs.summary
    return {"result": str(target), "workload": docs.run["workload"], "division": docs.run["division"],
            "ranks": docs.run["ranks"], "hosts": len(docs.run["hosts"]),
            "write_gib_s": s.get("write_bandwidth_mean_gib_s"),
            "read_gib_s": s.get("read_bandwidth_mean_gib_s"),
            "checkpoint_gib": round(s["checkpoint_bytes"] / GiB, 2), "invocations": invocations}


def cmd_import(args: Any) -> int:
    import json
    import sys

    from tabulate import tabulate

    root: Path = args.path
    if not root.exists():
        raise UsageError(f"{root}: no such folder")
    rows, problems = import_rows(root)
    if args.json:
        json.dump({"results": rows, "not_read": [{"folder": f, "why": w} for f, w in problems]}, sys.stdout,
                  indent=1)
        sys.stdout.write("\n")
        return ExitStatus.OK if rows else ExitStatus.FAILED
    if rows:
        print(tabulate([[r["result"], r["workload"], r["division"], r["ranks"], r["hosts"],
                         r["write_gib_s"], r["read_gib_s"], r["invocations"]] for r in rows],
                       headers=["result (UNVERIFIED)", "workload", "division", "ranks", "hosts",
                                "write GiB/s", "read GiB/s", "invocations"], floatfmt=".2f", missingval="—"))
    for folder, why in problems:
        print(f"not read: {folder}: {why}")
    print(f"{len(rows)} result{'s' if len(rows) != 1 else ''} read, {len(problems)} not read, under {root} "
          "(DLIO / mlpstorage folders: rank 0's timing, nothing signed or recomputed)")
    return ExitStatus.OK if rows else ExitStatus.FAILED
