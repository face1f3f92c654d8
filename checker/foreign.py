"""A DLIO or mlpstorage result folder as one side of ``mlckpt-check compare``: unverified.

Such a folder holds DLIO's ``summary.json`` (its ``metric`` block, ``num_accelerators``,
``num_hosts``, ``start``), and under mlpstorage a ``*_metadata.json`` (the model, the process
count, the checkpoint parameters) and DLIO's ``dlio_config/config.yaml``.  Nothing in it is signed
or recomputable: DLIO times rank 0, does not control the page cache and verifies nothing, so the
side is labelled unverified and every figure is quoted as the folder states it.  Files are read
with the same bounded strict loaders as bundles; a folder that is neither is one line, exit 2.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from checker.leaderboard import BundleDocs
from mlckpt import strict as loading
from mlckpt.errors import UsageError
from mlckpt.plan.aliases import WORKLOADS
from mlckpt.units import GiB

LABEL = "DLIO / mlpstorage result folder, UNVERIFIED: rank 0's timing, page cache not controlled"
# The compare rows such a folder states (others are blank: never guessed); the counts only when
# mlpstorage's metadata gives them.
STATED = {"workload", "division", "ranks", "hosts", "checkpoint_gib", "restore_gib", "verification",
          *(f"{op}_{what}" for op in ("write", "read")
            for what in ("bandwidth_mean_gib_s", "bandwidth_stdev_gib_s", "duration_mean_s"))}
_MAX_BYTES = 1 << 20


def is_foreign(path: Path) -> bool:
    """A folder holding DLIO's summary.json (and no mlckpt signature)."""
    return path.is_dir() and (path / "summary.json").is_file()


def _json(path: Path, what: str) -> Any:
    try:
        return loading.parse_json(loading.read_capped(path, _MAX_BYTES))
    except (OSError, loading.ParseError) as exc:
        raise UsageError(f"{what} {path}: {exc}") from None


def _number(doc: Mapping[str, Any], key: str) -> float | None:
    v = doc.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _metadata(folder: Path, which: str) -> Mapping[str, Any]:
    found = sorted(folder.glob("*_metadata.json"))
    doc = _json(found[0], which) if found else {}
    return doc if isinstance(doc, Mapping) else {}


def load_foreign(folder: Path, which: str) -> BundleDocs:
    """The folder's figures in the shape ``compare`` reads, marked unverified."""
    summary = _json(folder / "summary.json", which)
    metric = summary.get("metric") if isinstance(summary, Mapping) else None
    if not isinstance(metric, Mapping) or not isinstance(_number(metric, "checkpoint_size_GB"), float):
        raise UsageError(f"{which} {folder}: neither an mlckpt bundle nor a DLIO checkpointing result "
                         "(summary.json has no metric block with checkpoint_size_GB)")
    meta = _metadata(folder, which)
    args = meta.get("args") if isinstance(meta.get("args"), Mapping) else {}
    params = meta.get("parameters") if isinstance(meta.get("parameters"), Mapping) else {}
    ck = params.get("checkpoint") if isinstance(params.get("checkpoint"), Mapping) else {}
    model = str(args.get("model") or meta.get("model") or "unknown")
    ranks = int(_number(summary, "num_accelerators") or _number(meta, "num_processes") or 0)
    hosts = int(_number(summary, "num_hosts") or 0)
    out: dict[str, Any] = {"checkpoint_bytes": int(float(metric["checkpoint_size_GB"]) * GiB),
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
