"""GPU-resident state in the run (rules 1.7, ``state.source=gpu``): each rank opens its shard on its
host's GPU (local rank mod the host's count), pins its host buffers in place, and measures its own
copy rates alone, before the first checkpoint and again after the last restore, keeping the higher
of each (the rules bound every copy by it: a host busy during one probe must not make an honest
copy look impossible); rank 0 puts the ranks' entries into run.json's ``state`` block.  The copies
themselves are made by the write and read phases (see :mod:`mlckpt.engine.gpu`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mlckpt.run.collective import Job
from mlckpt.run.phases.gates import Gates, gpu_device

if TYPE_CHECKING:
    from mlckpt.engine import gpu
    from mlckpt.engine.content import Buffer


def open_gpu(job: Job, cfg: Mapping[str, Any], gates: Gates, arena: Any) -> tuple[Any, dict[str, Any]]:
    """This rank's DeviceState (the shard's bytes on the device, ``arena`` pinned) and its entry
    for run.json: device, name and the copy rates its probe measured while the others wait."""
    from mlckpt.engine import gpu

    host = next(h for h in gates.hosts if job.rank in h.ranks)
    local = host.ranks.index(job.rank)
    dev = gpu.open_state(gpu_device(cfg.get("state")), local, int(arena.nbytes))
    dev.pin(arena)
    d = dev.describe()
    entry = {"rank": job.rank, "host": job.host, "device": d["device"], "device_type": d["device_type"],
             "device_name": d["device_name"], **probe_alone(job, gates, dev, arena)}
    return dev, {"library": d["library"], "library_version": d["library_version"],
                 "copy_path": d["copy_path"], "entry": entry}


def probe_alone(job: Job, gates: Gates, dev: gpu.DeviceState, arena: Buffer) -> dict[str, float]:
    """This rank's copy rates, measured one rank at a time per host: ranks sharing a GPU (or its
    PCIe link) would halve each other's figure."""
    local = next(h for h in gates.hosts if job.rank in h.ranks).ranks.index(job.rank)
    rates: dict[str, float] = {}
    for i in range(max(len(h.ranks) for h in gates.hosts)):
        if i == local:
            rates = dev.probe(arena)
        job.idle_barrier()
    return rates


def probed_again(job: Job, gates: Gates, dev: gpu.DeviceState, arena: Buffer,
                 entry: Mapping[str, Any]) -> dict[str, Any]:
    """``entry`` with each copy rate the higher of its probe before the first checkpoint and one
    after the last restore (untimed)."""
    again = probe_alone(job, gates, dev, arena)
    return {**entry, **{k: max(float(entry.get(k) or 0.0), v) for k, v in again.items()}}


def state_block(mine: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """run.json's ``state`` for a GPU-source run, from rank 0's description and every rank's entry."""
    return {"source": "gpu", "library": mine["library"], "library_version": mine["library_version"],
            "copy_path": mine["copy_path"],
            "ranks": sorted((dict(e) for e in entries), key=lambda e: e["rank"])}
