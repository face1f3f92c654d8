"""The records of ``records.jsonl`` as typed shapes: one record per rank per op, written by the
runner (mlckpt/run/collective.py, the phases) and read by the metrics (mlckpt/metrics.py,
mlckpt/serving_metrics.py) and the rules.  Pure.

Record fields by format version (one JSON object per line of ``records.jsonl``; the version
history itself is kept in mlckpt/formats.py):
  1: first version: ``op`` (write|read), ``index`` (1-based op number), ``checkpoint``
     (checkpoint number the op wrote or restored), ``rank``, ``host``, ``t0_ns``/``t1_ns``
     (monotonic clock of that rank's host: leaving the barrier / last byte durable or read),
     ``bytes``, ``files``, ``fsync`` (every file and its directory fsynced inside [t0, t1]),
     ``resident_bytes``/``cached_check_bytes`` (reads: page-cache residency of the files just
     before the op), ``verified_bytes``/``mismatches`` (reads: verification after the op).
  2: asynchronous and tiered checkpointing (see mlckpt/workload/pipeline.py).  Writes add ``mode``
     (sync|async); ``t1_ns`` is now the moment the checkpoint is durable on the durable tier;
     ``staged_ns`` (training resumes: the end of the stall; equals ``t1_ns`` for sync, one tier),
     ``backpressure_ns`` (part of the stall spent waiting for the previous checkpoint's
     background work), ``exposed_ns`` (the part of this checkpoint's background interval
     [staged, durable] that training spent waiting for it, in the next checkpoint's back-pressure
     or the final drain for the last one; at most that back-pressure, which also counts the
     thread wake-up after durability),
     ``compute_ns`` (the training interval measured after the stall) and ``stages``: one entry
     per stage in order, ``{tier: memory|fast|durable, t0_ns, t1_ns, bytes}`` plus
     ``verified_bytes``/``mismatches`` for a drain (fast → durable, every page verified).  Reads
     add ``tier`` (fast|durable: where the restore read from).
  3: evidence the checker cross-examines (rules 1.2).  The records of each host's first rank add
     ``host_counters``: ``{device, before, after}``, the kernel's counters of that host sampled
     before the op's barrier and after every rank agreed the op ended (so the window holds every
     op of the host's ranks): ``t_ns`` (same clock as t0/t1), ``read_bytes``/``written_bytes``/
     ``busy_ms`` of the checkpoint folder's block device ``device`` (MAJOR:MINOR; absent without
     one), ``cached_bytes``/``dirty_bytes``/``writeback_bytes``/``shmem_bytes`` (/proc/meminfo).
  4: what changes the figure (rules 1.4).  Every write and read record adds ``cpu_ns`` (the rank
     process's CPU time, user + system, all its threads, over [t0, t1]) and, where
     /proc/self/smaps could be read, ``state_bytes``/``state_huge_bytes`` (the rank's state
     buffer, and how much of it transparent huge pages back, read before the barrier of the rank's
     first write and of its first restore, on those records only).

Later formats (5 and on) are described in mlckpt/formats.py, with the fields below.
"""

from __future__ import annotations

from typing import TypedDict

from mlckpt import latency


class StageRecord(TypedDict, total=False):
    """One stage of a write (records format 2): where it went and when.  ``direct`` on file
    stages; ``verified_bytes``/``mismatches`` on a drain."""

    tier: str  # memory | fast | durable
    t0_ns: int
    t1_ns: int
    bytes: int
    direct: bool
    verified_bytes: int
    mismatches: int


# One host's kernel counters at ``t_ns`` (records format 3; mlckpt.host.facts.counters_sample):
# ``read_bytes``/``written_bytes``/``busy_ms`` of the device where it is known,
# ``cached_bytes``/``dirty_bytes``/``writeback_bytes``/``shmem_bytes``, and from records format 6
# what the kernel charged to the host's ranks (``own_*``), ``cpu_busy_ns`` and ``read_ns``.  Which
# counters a sample holds depends on the host, so it is a plain mapping of counter to integer.
CounterSample = dict[str, int]


class _HostExtras(TypedDict, total=False):
    cpus: int  # records format 6: the host's CPUs, to weigh other processes' CPU time
    # records format 7: the device sampled through the op (mlckpt.host.facts.DeviceSampler's rows)
    samples: list[list[int]]


class HostCounters(_HostExtras):
    device: str | None  # MAJOR:MINOR of the checkpoint folder's block device
    before: CounterSample
    after: CounterSample


class LibraryFields(TypedDict, total=False):
    """What a library writer's write and read records add (records format 8)."""

    writer: str  # mlckpt | torch_save | torch_dcp | safetensors
    file_bytes: int  # a library write's files on disk
    synced_by: str  # library | mlckpt
    tensors: int  # records format 12: the tensors the library's op saved or loaded


class RequestFields(TypedDict, total=False):
    """Records format 7: the op's requests' latencies and where their time went."""

    requests: latency.Requests
    phases_ns: dict[str, int]


class _Evidence(LibraryFields, RequestFields, total=False):
    host_counters: HostCounters  # on each host's first rank (records format 3)
    cpu_ns: int  # records format 4
    state_bytes: int  # records format 4, where /proc/self/smaps could be read
    state_huge_bytes: int
    device_copy_ns: int  # records format 5: a GPU-source run's copy between the device and the host
    witness_host_ns: list[int]  # records format 7: a witnessed op's rank 0, its own time around it


class OpRecord(_Evidence):
    """The fields every record has (records format 2), writes and reads alike; ``host_counters``
    on the records of each host's first rank (format 3)."""

    op: str  # write | read
    index: int
    checkpoint: int
    rank: int
    host: str
    t0_ns: int
    t1_ns: int
    wall_start: float
    bytes: int
    files: int
    fsync: bool
    direct: bool
    dontcache: bool


class WriteRecord(OpRecord):
    mode: str  # sync | async
    staged_ns: int
    backpressure_ns: int
    exposed_ns: int
    compute_ns: int
    stages: list[StageRecord]


class ReadRecord(OpRecord):
    resident_bytes: int
    cached_check_bytes: int
    verified_bytes: int
    mismatches: int
    tier: str  # fast | durable


class LoadRecord(_Evidence, total=False):
    """A serving run's load on one rank (records format 9; 10 adds the op timer's evidence and
    node_tier_resident_bytes, 11 a witnessed load's witness_host_ns): mlckpt/serving_metrics.py
    recomputes a load's figures from them."""

    op: str  # load
    index: int
    rank: int
    replica: int
    shard: int
    host: str
    strategy: str
    t0_ns: int
    t1_ns: int
    wall_start: float
    direct: bool
    bytes: int  # the rank's shard, placed in its memory
    storage_bytes: int
    node_tier_bytes: int
    received_bytes: int
    resident_bytes: int
    node_tier_resident_bytes: int
    exchange_cpu_ns: int  # records format 12, fan-out: the load's exchange, its CPU time on this rank
    exchange_tail_ns: int  # ... and its wall time after the rank's last read (what reading did not hide)
    verified_bytes: int


class ResumeRecord(_Evidence, total=False):
    """A resume run's resume on one new rank (records format 13, with the op timer's evidence):
    mlckpt/resume_metrics.py recomputes a resume's figures from them, RESUME-PLAN holds them to
    both plans."""

    op: str  # resume
    index: int
    rank: int
    host: str
    t0_ns: int
    t1_ns: int
    wall_start: float
    direct: bool
    metadata_ns: int  # reading and parsing the checkpoint's index
    planning_ns: int  # the rank's byte ranges worked out from it
    read_ns: int  # reading them
    placing_ns: int  # copying them to their places in the new state
    bytes: int  # the rank's new state
    read_bytes: int
    index_bytes: int
    needs: int
    reads: int
    tensors: int
    files: int
    resident_bytes: int
    verified_bytes: int
