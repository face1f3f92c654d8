"""Facts about this host, read from /proc, statvfs and the libraries.  Effects (reads only)."""

from __future__ import annotations

import os
import platform
import socket
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

from mlckpt import __version__
from mlckpt.records import CounterSample
from mlckpt.strict import printable

# torch and safetensors: a library run's run.json names the version its writer used, which
# LIBRARY-VERSION holds to the hosts' own (rules 1.18)
PACKAGES = ("mlckpt", "numpy", "mpi4py", "mpich", "hydra-core", "cryptography", "jsonschema", "torch",
            "safetensors")


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


def boot_id() -> str | None:
    """This kernel's boot id: two "hosts" with one boot id are one machine."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:64] or None
    except OSError:
        return None


def net_links_mbps() -> dict[str, int]:
    """Link speed of every network interface that reports one (Mb/s; not the loopback)."""
    out: dict[str, int] = {}
    try:
        names = sorted(os.listdir("/sys/class/net"))
    except OSError:
        return out
    for name in names:
        if name == "lo":
            continue
        try:
            speed = int(Path(f"/sys/class/net/{name}/speed").read_text().strip())
        except (OSError, ValueError):
            continue
        if speed > 0:
            out[name[:64]] = speed
    return out


def block_device(path: Path) -> str | None:
    """``MAJOR:MINOR`` of the block device holding ``path``, where the kernel keeps its counters
    (/sys/dev/block/M:m/stat); None on filesystems without one (tmpfs, overlay, NFS, btrfs)."""
    try:
        st = os.stat(existing_ancestor(path))
    except OSError:
        return None
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    return dev if os.path.exists(f"/sys/dev/block/{dev}/stat") else None


# /sys/block/<dev>/stat fields (Documentation/block/stat.rst): sectors are 512 bytes whatever
# the device's sector size; io_ticks is the time the device had I/O in flight.
_SECTOR = 512
_STAT_FIELDS = {"read_bytes": 2, "written_bytes": 6, "busy_ms": 9}
_MEMINFO_FIELDS = {"cached_bytes": "Cached", "dirty_bytes": "Dirty", "writeback_bytes": "Writeback",
                   "shmem_bytes": "Shmem"}


_TICK_NS = 1_000_000_000 // (os.sysconf("SC_CLK_TCK") or 100)


def _proc_read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def processes_io(pids: Sequence[int]) -> dict[str, int] | None:
    """What the kernel charged to these processes (every thread, living or ended): bytes they
    made the block layer read and bytes they wrote or dirtied for writing (/proc/<pid>/io), and
    their CPU time, user and system (/proc/<pid>/stat).  None if one of them cannot be read (a
    /proc mounted with hidepid, a process gone)."""
    rd = wr = cpu = 0
    try:
        for pid in pids:
            io = _proc_read(f"/proc/{pid}/io").split()
            # "rchar: N wchar: N syscr: N syscw: N read_bytes: N write_bytes: N ..."
            rd += int(io[io.index(b"read_bytes:") + 1])
            wr += int(io[io.index(b"write_bytes:") + 1])
            # the command name (field 2) may hold spaces: count fields after its closing bracket
            fields = _proc_read(f"/proc/{pid}/stat").rpartition(b")")[2].split()
            cpu += (int(fields[11]) + int(fields[12])) * _TICK_NS  # utime, stime
    except (OSError, ValueError, IndexError):
        return None
    return {"own_read_bytes": rd, "own_written_bytes": wr, "own_cpu_ns": cpu}


def host_cpu_busy_ns() -> int | None:
    """CPU time the whole host spent busy (every CPU, anything but idle and iowait), /proc/stat."""
    try:
        fields = [int(x) for x in _proc_read("/proc/stat").split(b"\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(fields) - fields[3] - fields[4]) * _TICK_NS


SAMPLE_INTERVAL_S = 0.1  # io.sample_interval_s's default


class DeviceSampler:
    """A block device's byte counters, [t_ns, read_bytes, written_bytes], every ``interval_s`` on a
    thread of its own from :meth:`start` to :meth:`stop` (records format 7's timeline of an op:
    a sysfs read of ~20 µs per sample, outside the ranks' threads)."""

    def __init__(self, device: str, interval_s: float) -> None:
        self.device, self.interval_s = device, interval_s
        self._samples: list[list[int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _one(self) -> None:
        try:
            fields = Path(f"/sys/dev/block/{self.device}/stat").read_text().split()
            self._samples.append([time.perf_counter_ns(), int(fields[2]) * _SECTOR, int(fields[6]) * _SECTOR])
        except (OSError, ValueError, IndexError):
            pass

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._one()

    def start(self) -> None:
        self._samples, self._stop = [], threading.Event()
        self._one()
        self._thread = threading.Thread(target=self._loop, name="mlckpt-device-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> list[list[int]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._one()
        return self._samples


def counters_sample(device: str | None, pids: Sequence[int] = (), *,
                    closing: bool = False) -> CounterSample:
    """The host's kernel counters now: the device's bytes read and written and busy time (when
    known), the page cache's size and dirty state; with ``pids`` (the host's ranks, records
    format 6) what the kernel charged to them (:func:`processes_io`) and the host's busy CPU time,
    so the device's bytes split into the run's and everyone else's; ``t_ns`` on the clock of the
    op records, taken last, and ``read_ns``, how long the sample took.

    The kernel charges a process's bytes when it submits them and counts the device's when they
    complete, so an opening sample reads the device before the processes and a ``closing`` one
    after them: whatever the ranks submitted in between is then inside the device's interval."""
    start = time.perf_counter_ns()
    out: dict[str, int] = {}
    if pids and closing:
        _own_into(out, pids)
    if device is not None:
        try:
            fields = Path(f"/sys/dev/block/{device}/stat").read_text().split()
            for key, i in _STAT_FIELDS.items():
                out[key] = int(fields[i]) * (_SECTOR if key.endswith("_bytes") else 1)
        except (OSError, ValueError, IndexError):
            pass
    if pids and not closing:
        _own_into(out, pids)
    info = meminfo()
    for key, name in _MEMINFO_FIELDS.items():
        if name in info:
            out[key] = info[name]
    out["t_ns"] = time.perf_counter_ns()
    if pids:
        out["read_ns"] = out["t_ns"] - start
    return out


def _own_into(out: dict[str, int], pids: Sequence[int]) -> None:
    own = processes_io(pids)
    busy = host_cpu_busy_ns()
    if own is not None and busy is not None:
        out.update(own, cpu_busy_ns=busy)


def memory_copy_gib_s(threads: int | None = None, per_thread_bytes: int = 16 << 20) -> float:
    """This host's memory copy rate (GiB/s copied, best of 5), with one copy per thread at once:
    an upper bound for what the host can move between its memory and anything else."""
    import numpy as np

    n = max(1, min(threads or os.cpu_count() or 1, 64))
    # Small enough to be quick at gate time; a cache-sized copy only overstates the rate, which
    # keeps the bound it gives conservative.
    src = [np.full(per_thread_bytes, 1, dtype=np.uint8) for _ in range(n)]
    dst = [np.full(per_thread_bytes, 0, dtype=np.uint8) for _ in range(n)]

    def copy(d: Any, s: Any) -> float:  # the copying thread's own CPU time
        t0 = time.thread_time()
        np.copyto(d, s)
        return max(time.thread_time() - t0, 1e-9)

    best = 0.0
    # Each copy is timed by its thread's CPU clock, not the wall clock: on a host whose cores other
    # processes keep busy a wall-clock round ran at a third of the rate, and the bound it set
    # (HOST-PHYSICS) fell below what an honest snapshot then did once the host was free.  The
    # threads start before the timing, and the best of 5 rounds counts.
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(copy, dst, src))
        for _ in range(5):
            rates = [per_thread_bytes / s for s in pool.map(copy, dst, src)]
            best = max(best, sum(rates) / 2**30)
    return best


def host_facts(target: Path, mpi_library: str = "") -> dict[str, object]:
    """What the host says about itself, every string printable (strict.printable): Open MPI's
    library version ends in a NUL byte."""
    info = meminfo()
    return printable({
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
        "boot_id": boot_id(),
        "block_device": block_device(target),
        "net_links_mbps": net_links_mbps(),
        "memory_copy_gib_s": round(memory_copy_gib_s(), 3),
    })
