"""Result folders as MLPerf Storage publishes them (DLIO's summary.json beside mlpstorage's
metadata), written from the figures a test asks for: what ``mlckpt-check import``, ``compare`` and
the leaderboard's ``--published`` read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GIB_8B = 104.7045  # llama3-8b's checkpoint in DLIO's "GB", which are GiB


def invocation(folder: Path, *, write: float | None = None, read: float | None = None, hosts: int = 2,
               model: str = "llama3-8b", division: str = "CLOSED", processes: int = 8,
               start: str = "2026-07-22T18:57:02", end: str = "2026-07-22T18:59:25",
               metadata_hosts: int | None = None) -> Path:
    """One mlpstorage invocation as published: DLIO's summary.json (save_* for writes, load_* for
    reads) and mlpstorage's checkpointing_<ts>_metadata.json, about 43 KB per host."""
    folder.mkdir(parents=True)
    metric: dict[str, Any] = {"checkpoint_size_GB": GIB_8B}
    if write is not None:
        metric.update(save_checkpoint_io_mean_GB_per_second=write, save_checkpoint_io_stdev_GB_per_second=0.5,
                      save_checkpoint_duration_mean_seconds=GIB_8B / write)
    if read is not None:
        metric.update(load_checkpoint_io_mean_GB_per_second=read, load_checkpoint_io_stdev_GB_per_second=0.5,
                      load_checkpoint_duration_mean_seconds=GIB_8B / read)
    (folder / "summary.json").write_text(json.dumps({
        "start": start, "end": end, "num_accelerators": processes, "num_hosts": hosts, "metric": metric}))
    n = metadata_hosts if metadata_hosts is not None else hosts
    per_host = {f"host{i:04d}": {"cpu": "x" * 40_000, "meminfo": {"MemTotal": 1 << 40}} for i in range(n)}
    checkpoint = {"num_checkpoints_write": 10 if write is not None else 0,
                  "num_checkpoints_read": 10 if read is not None else 0, "fsync": True}
    (folder / f"checkpointing_{folder.name}_metadata.json").write_text(json.dumps({
        "args": {"model": model, "num_processes": processes}, "verification": division,
        "parameters": {"checkpoint": checkpoint}, "system_info": per_host}))
    return folder
