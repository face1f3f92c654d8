"""Facts about this host, read from /proc, statvfs and the libraries.  Effects (reads only)."""

from __future__ import annotations

import os
import platform
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from mlckpt import __version__

PACKAGES = ("mlckpt", "numpy", "mpi4py", "mpich", "hydra-core", "cryptography", "jsonschema")


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    except OSError:
        pass
    return out


def mem_available_bytes() -> int:
    info = meminfo()
    return info.get("MemAvailable", info.get("MemFree", 0))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def existing_ancestor(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def mount_of(path: Path) -> dict[str, str]:
    """Filesystem type, source and options of the mount holding ``path`` (/proc/self/mountinfo)."""
    target = os.path.realpath(existing_ancestor(path))
    best: dict[str, str] = {}
    best_len = -1
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        left, _, right = line.partition(" - ")
        f = left.split()
        r = right.split()
        if len(f) < 6 or len(r) < 2:
            continue
        mnt = f[4].replace("\\040", " ")
        if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) > best_len:
            best_len = len(mnt)
            best = {"mount_point": mnt, "fs_type": r[0], "source": r[1],
                    "mount_options": f[5] + ("," + r[2] if len(r) > 2 else "")}
    return best


def disk_free_bytes(path: Path) -> int:
    st = os.statvfs(existing_ancestor(path))
    return st.f_bavail * st.f_frsize


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    out["mlckpt"] = __version__
    return out


def host_facts(target: Path, mpi_library: str = "") -> dict[str, Any]:
    info = meminfo()
    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "memory_total_bytes": info.get("MemTotal"),
        "memory_available_bytes": info.get("MemAvailable"),
        "kernel": platform.release(),
        "os": platform.platform(),
        "target_path": str(target.absolute()),
        "filesystem": mount_of(target),
        "mpi_library": mpi_library,
        "python": sys.version.split()[0],
        "packages": package_versions(),
    }
