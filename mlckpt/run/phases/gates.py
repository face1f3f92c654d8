"""The gates: what every host measures before any I/O, and how the rules judge it.

Importable without MPI: ``mlckpt run`` applies the same gates to the local host before it spawns
any rank (``mlckpt.cli.run_cmd``), and every rank applies them again under mpiexec, with the rule
set the checker uses.  Measuring is an effect (free space, memory, the folder, O_DIRECT probes);
judging (:func:`judge`) is pure.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlckpt import engine
from mlckpt.errors import UsageError
from mlckpt.host.facts import disk_free_bytes, existing_ancestor, host_facts, mem_available_bytes, mount_of
from mlckpt.plan.config import Setup
from mlckpt.plan.settings import Settings
from mlckpt.rules import Finding, HostSpec, gpu_source, rank_shift, verdict
from mlckpt.run.storage import objectstore
from mlckpt.run.storage.cleanup import RUN_MARKER
from mlckpt.run.storage.folderlock import LOCK
from mlckpt.run.storage.kinds import takes_page_cache


def blocking_message(findings: Sequence[Finding], division: str) -> str | None:
    """The refusal for findings that forbid running: any ``invalid`` one, and in the closed
    division any ``open`` one (the run could never be a closed result).  The first on the error
    line, every other on a line of its own."""
    blocking = [
        f for f in findings if f.severity == "invalid" or (f.severity == "open" and division == "closed")
    ]
    if not blocking:
        return None
    f = blocking[0]
    hint = " (closed division: fix it, or run with division=open)" if f.severity == "open" else ""
    # Every blocking finding, one compact line each: fixing one must not reveal the next.
    also = "".join(f"\n  also: [{g.rule}] {g.message}" for g in blocking[1:])
    return f"[{f.rule}] {f.message}{hint}{also}"


def description_refusal(run: Settings) -> UsageError | None:
    """A closed run needs the system description its result is published with: asked for before
    any I/O, not discovered when the bundle cannot be submitted without a hand edit."""
    if run.division == "closed" and not run.system:
        return UsageError("system: a closed run needs a system description (system=FILE; "
                          "`mlckpt describe-system FOLDER --out FILE` drafts one)", key="system")
    return None


def folder_problem(folder: Path) -> str | None:
    """Why ``folder`` can't hold checkpoints, or None.  It may be missing (created later) if its
    parent is a writable directory; if present it must be a writable directory whose entries are
    all mlckpt run folders (carrying RUN_MARKER), besides a run's lock (mlckpt.run.storage.folderlock)."""
    if folder.is_symlink() and not folder.exists():
        return f"{folder} is a dangling link"
    if folder.exists():
        if not folder.is_dir():
            return f"{folder} is not a directory"
        if not os.access(folder, os.W_OK | os.X_OK):
            return f"{folder} is not writable"
        foreign = [
            e.name
            for e in os.scandir(folder)
            if e.name != LOCK and not e.name.startswith(LOCK + ".")  # the lock, or one being taken
            and not (e.is_dir(follow_symlinks=False) and (Path(e.path) / RUN_MARKER).exists())
        ]
        if foreign:
            shown = ", ".join(sorted(foreign)[:3]) + (" …" if len(foreign) > 3 else "")
            return f"{folder} holds files mlckpt did not write ({shown})"
        return None
    parent = existing_ancestor(folder)
    if parent != folder.parent:
        # mlckpt creates the folder itself, never the path to it: a mistyped path would otherwise
        # be benchmarked on whatever disk holds its first existing ancestor.
        return (f"{folder}: its parent {folder.parent} does not exist (a mistyped path? mlckpt creates "
                f"only the last folder: create the rest first, e.g. mkdir -p {folder.parent})")
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable (needed to create {folder})"
    return None


def same_filesystem(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` (or, missing, the folders that will hold them) share a filesystem."""
    return os.stat(existing_ancestor(a)).st_dev == os.stat(existing_ancestor(b)).st_dev


def output_problem(root: Path) -> str | None:
    """Why ``output.root`` cannot take result folders, or None: it must be a writable directory,
    or be missing with a writable directory as its nearest existing ancestor."""
    if root.is_symlink() and not root.exists():
        return f"{root} is a dangling link"
    target = root if root.exists() else existing_ancestor(root)
    if not target.is_dir():
        return f"{target} is not a directory"
    if not os.access(target, os.W_OK | os.X_OK):
        return f"{target} is not writable" + ("" if target == root else f" (needed to create {root})")
    return None


def fast_tier_facts(fast: str | None, durable: Path) -> dict[str, Any]:
    """What the gates need to know of this host's fast tier (nothing when there is none): free
    space, whether the folder is usable (a folder of its own: not inside the durable tier's, nor
    holding it, once links are resolved), its filesystem type, and whether it takes O_DIRECT."""
    out: dict[str, object] = {
        "fast_free_bytes": None,
        "fast_problem": None,
        "fast_fs": None,
        "fast_direct_ok": False,
    }
    if fast is None:
        return out
    folder = Path(fast).absolute()
    a, b = Path(os.path.realpath(folder)), Path(os.path.realpath(durable.absolute()))
    if a == b or a.is_relative_to(b) or b.is_relative_to(a):
        out["fast_problem"] = f"{folder} and the durable tier's folder {durable} overlap"
        return out
    out["fast_problem"] = folder_problem(folder)
    if out["fast_problem"] is None:
        out["fast_free_bytes"] = disk_free_bytes(folder)
        out["fast_fs"] = mount_of(folder).get("fs_type")
        out["fast_direct_ok"] = engine.probe_direct(str(existing_ancestor(folder)))
    return out


def gpu_device(state: Mapping[str, Any] | None) -> str | None:
    """``state.gpu.device`` as the GPU engine takes it (None: auto), or None for host memory."""
    device = ((state or {}).get("gpu") or {}).get("device")
    return None if device is None else str(device)


def gpu_host_facts(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """A GPU-source run (rules 1.7): this host's GPUs (system.json's ``gpus``) or why the state
    cannot live there (GPU-USABLE); nothing for a run whose state is in host memory."""
    if config is None or not gpu_source(config):
        return {}
    from mlckpt.engine import gpu  # the array library loads only for a GPU-source run

    facts, problem = gpu.probe_host(gpu_device(config.get("state")))
    return {"gpu_problem": problem, "gpus": facts}


def local_host(folder: Path, ranks: Sequence[int], fast: str | None = None,
               results: Path | None = None, config: Mapping[str, Any] | None = None) -> HostSpec:
    """This host as the gates measure it (used by the self-launcher before spawning ranks);
    ``config``: a run on object storage, whose store is probed instead of a folder, or with its
    state in GPU memory, whose devices are probed too."""
    gpu = gpu_host_facts(config)
    if config is not None and not takes_page_cache(config["checkpoint"]["folder"]):
        m = measure_object_host(socket.gethostname(), config, "", results)
        return HostSpec(m["host"], tuple(ranks), m["mem_available_bytes"], results_same_fs=False,
                        store_problem=m["store_problem"])
    f = fast_tier_facts(fast, folder)
    return HostSpec(
        socket.gethostname(),
        tuple(ranks),
        mem_available_bytes(),
        disk_free_bytes(folder),
        folder_problem(folder),
        f["fast_free_bytes"],
        f["fast_problem"],
        f["fast_fs"],
        results_same_fs=same_filesystem(folder, results) if results is not None else None,
        gpu_problem=gpu.get("gpu_problem"),
        folder_fs=mount_of(folder).get("fs_type"),
    )


def measure_host(
    host: str, folder: Path, io: Mapping[str, Any], fast: str | None, mpi_library: str,
    results: Path | None = None, config: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """Everything one host's leader measures for the gates (a plain dict: it crosses MPI)."""
    local: dict[str, Any] = {
        "host": host,
        "mem_available_bytes": mem_available_bytes(),
        "disk_free_bytes": disk_free_bytes(folder),
        "folder_problem": folder_problem(folder),
        "direct_ok": None,
        "dontcache_ok": None,
        "facts": host_facts(folder, mpi_library),
        "results_same_fs": same_filesystem(folder, results) if results is not None else None,
        **fast_tier_facts(fast, folder),
    }
    gpu = gpu_host_facts(config)
    if gpu:
        local["gpu_problem"] = gpu["gpu_problem"]
        local["facts"]["gpus"] = gpu["gpus"]
    if local["folder_problem"] is None:
        probe_dir = str(existing_ancestor(folder))
        if io["direct"]:
            local["direct_ok"] = engine.probe_direct(probe_dir)
        elif io["dontcache"]:
            local["dontcache_ok"] = engine.probe_dontcache(probe_dir)
    return local


def measure_object_host(host: str, config: Mapping[str, object], mpi_library: str,
                        results: Path | None = None) -> dict[str, Any]:
    """measure_host for a run on object storage: no folder, free space or I/O-mode probes; the
    store's probe instead (OBJECT-STORE-USABLE)."""
    return {
        "host": host,
        "mem_available_bytes": mem_available_bytes(),
        "disk_free_bytes": None,
        "folder_problem": None,
        "direct_ok": None,
        "dontcache_ok": None,
        "results_same_fs": False,  # results are files, checkpoints objects: never one filesystem
        **fast_tier_facts(None, Path(".")),
        **objectstore.measure(config, host, mpi_library, results),
    }


def host_specs(names: Sequence[str], measured: Sequence[Mapping[str, Any]]) -> tuple[HostSpec, ...]:
    """The hosts in first-rank order, each with its ranks and its leader's measurements."""
    by_host = {m["host"]: m for m in measured}
    zero = by_host[names[0]].get("wall_s") if names else None
    return tuple(
        HostSpec(
            name=h,
            ranks=tuple(r for r, n in enumerate(names) if n == h),
            mem_available_bytes=by_host[h]["mem_available_bytes"],
            disk_free_bytes=by_host[h]["disk_free_bytes"],
            folder_problem=by_host[h]["folder_problem"],
            fast_free_bytes=by_host[h]["fast_free_bytes"],
            fast_problem=by_host[h]["fast_problem"],
            fast_fs=by_host[h]["fast_fs"],
            direct_ok=by_host[h]["direct_ok"],
            dontcache_ok=by_host[h]["dontcache_ok"],
            results_same_fs=by_host[h].get("results_same_fs"),
            clock_offset_s=(None if zero is None or by_host[h].get("wall_s") is None
                            else by_host[h]["wall_s"] - zero),
            store_problem=by_host[h].get("store_problem"),
            gpu_problem=by_host[h].get("gpu_problem"),
            folder_fs=((by_host[h].get("facts") or {}).get("filesystem") or {}).get("fs_type"),
        )
        for h in dict.fromkeys(names)
    )


def io_engine_refusal(measured: Sequence[Mapping[str, object]], folder: str) -> UsageError | None:
    """The runner's own refusal of an I/O mode a host cannot do, for rule sets without the
    IO-ENGINE rule (1.0); from 1.1 on the rule says it, with the same data."""
    for m in measured:
        if m["direct_ok"] is False:
            return UsageError(
                f"[IO-ENGINE] host {m['host']}: io.direct=true but the filesystem at {folder} refuses "
                "O_DIRECT (e.g. tmpfs); use io.direct=false",
                key="io.direct",
            )
        if m["dontcache_ok"] is False:
            return UsageError(
                f"[IO-ENGINE] host {m['host']}: io.dontcache=true but RWF_DONTCACHE is not "
                "supported here (Linux 6.14+ and filesystem support needed)",
                key="io.dontcache",
            )
    return None


@dataclass(frozen=True)
class Gates:
    """What the gates established, for every later phase."""

    hosts: tuple[HostSpec, ...]
    rank_hosts: tuple[str, ...]  # host of each rank
    facts: tuple[Mapping[str, object], ...]  # each host's measured facts (system.json)
    findings: tuple[Finding, ...]
    verdict: str
    shift: int  # the effective restore rank shift
    fast_direct: Mapping[str, bool]  # host -> its fast tier takes O_DIRECT
    fast_fs: Mapping[str, str | None]  # host -> its fast tier's filesystem type

    def leader(self, rank: int) -> bool:
        """Whether ``rank`` is its host's first rank (it makes the host's folders)."""
        return next(h for h in self.hosts if rank in h.ranks).ranks[0] == rank


def judge(setup: Setup, names: Sequence[str], measured: Sequence[Mapping[str, Any]]) -> Gates:
    """Every rank evaluates the same rules on the same data, so every host refuses alike.  Raises
    UsageError (one line, exit 2) for a blocking finding or an I/O mode a host cannot do."""
    hosts = host_specs(names, measured)
    ctx = setup.context(hosts, complete=True, measured=True)
    findings = setup.rules.evaluate(ctx, ["config", "host"]).findings
    division = setup.settings.division
    refusal = blocking_message(findings, division)
    if refusal:
        raise UsageError(refusal)
    missing = description_refusal(setup.settings)
    if missing is not None:
        raise missing
    if not any(r.id == "IO-ENGINE" for r in setup.rules.rules):  # rules 1.0: refuse in our own words
        err = io_engine_refusal(measured, setup.settings.checkpoint.folder)
        if err is not None:
            raise err
    return Gates(
        hosts,
        tuple(names),
        tuple(m["facts"] for m in measured),
        findings,
        verdict(findings, division),
        rank_shift(ctx),
        {m["host"]: bool(m["fast_direct_ok"]) for m in measured},
        {m["host"]: m["fast_fs"] for m in measured},
    )
