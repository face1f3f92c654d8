"""Every persisted format mlckpt writes or reads: its current version, the versions this code
still reads, and its history (newest last).  The one place a version is defined: modules import
their constant from here, and ``tests/unit/formats/test_formats.py`` checks that each history ends at the
current version and that what is written carries it.

A released rules folder (``rules/<version>/``) fixes the schemas a bundle made under it is judged
by; a new format version therefore goes with a new rules version.  Pure: no project imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

# A format's versions are numbers (a record's format) or names ("1.0", a digest's algorithm).
V = TypeVar("V", int, str)


@dataclass(frozen=True)
class Format(Generic[V]):
    name: str
    where: str  # the file or field that carries it
    version: V
    reads: tuple[V, ...]  # versions this code accepts as input
    history: tuple[tuple[V, str], ...]  # (version, what changed), oldest first

    def __post_init__(self) -> None:
        if not self.history or self.history[-1][0] != self.version:
            raise ValueError(f"{self.name}: the history must end at version {self.version!r}")
        if self.version not in self.reads:
            raise ValueError(f"{self.name}: must read its own version {self.version!r}")


RUN = Format("run", "run.json: run_format", 13, (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13), (
    (1, "first version: run identity, status, workload, division, scaled, verdict, findings, overrides, "
        "host mapping, timings, file list"),
    (2, "pipeline: checkpoint mode, compute interval, fast tier (folder, fast_keep, filesystem type per "
        "host); records format 2"),
    (3, "rules 1.2: records format 3; system.json's host facts add boot_id, block_device (MAJOR:MINOR of the "
        "checkpoint folder's device), net_links_mbps and memory_copy_gib_s (measured at the gates)"),
    (4, "rules 1.3: restored_from (null, or for a read-only invocation the write invocation it restored: "
        "run_id, name, num_writes, the sha256 of its signed statement, when it ended)"),
    (5, "rules 1.4: witness (null, or the witness's endpoint without credentials, key id, run at the "
        "witness, status witnessed|lost, the reason it was lost, each write's nonce, and the transcript "
        "file witness.dsse.json); a witnessed write's page tags carry run_id XOR the nonce's first 8 bytes"),
    (6, "rules 1.6: storage (kind posix, or kind s3 with the client library and version, the endpoint's "
        "host and port without credentials, region, bucket, key prefix, part_size, inflight, "
        "addressing_style, verify_tls); system.json's filesystem of an object run is fs_type s3, source "
        "the endpoint's host, mount_point the s3:// folder"),
    (7, "rules 1.7: records format 5; state (null: the state in host memory; or the GPU source: library and "
        "version, copy_path, and per rank its device, device type and name and the device-to-host and "
        "host-to-device rates it measured alone before the first checkpoint); system.json's hosts add gpus "
        "(library, device type, count, names) in a GPU-source run"),
    (8, "rules 1.8: records format 6; calibration (each host's timing measured before the first op: per "
        "empty op the spread of its ranks' barrier exits, the leader's t0 after its counters, the counters "
        "after the host's last t0; mlckpt/run/phases/calibrate.py); verdict may be disturbed"),
    (9, "rules 1.9: each host's calibration adds background (the device and its leader's counters around "
        "attribution.background_s of the run asleep before the first op: what other processes moved with "
        "the run idle)"),
    (10, "rules 1.10: content_commitment (a write invocation kept for a read-only one: sha256 of its "
         "content proof; else null) and restored_from.content_proof (sha256 of a domain tag and the "
         "write invocation's content key, which only the checkpoints' own folder holds); "
         "mlckpt/rules/checks/split.py"),
    (11, "rules 1.11: records format 8; framework (null: mlckpt's engine wrote every checkpoint; or the "
         "library writer: writer, library, library_version, settings, reference, synced_by; "
         "mlckpt/workload/frameworks.py)"),
    (12, "rules 1.13: records format 9; serving (null: a checkpoint run; or a serving run as it ran: "
         "strategy, tp, replicas, loads, shard_file_bytes, node_tier; mlckpt/workload/serving_run.py)"),
    (13, "rules 1.21: records format 13; resume (null: another kind of run; or a resume run as it ran: "
         "from_ranks, from_tensor, from_pipeline, resumes; mlckpt/workload/resume_run.py)"),
))

RECORDS = Format("records", "records.jsonl (run.json and summary.json: records_format)", 14,
                 (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14), (
    (1, "first version: op, index, checkpoint, rank, host, t0_ns/t1_ns (the host's monotonic clock), bytes, "
        "files, fsync, resident_bytes/cached_check_bytes (reads), verified_bytes/mismatches (reads); the "
        "field meanings are written out in mlckpt/metrics.py"),
    (2, "asynchronous and tiered checkpoints: writes add mode, staged_ns, backpressure_ns, exposed_ns, "
        "compute_ns and stages (one entry per stage: tier, t0_ns, t1_ns, bytes, verified_bytes/mismatches "
        "for a drain); t1_ns is when the checkpoint is durable; reads add tier"),
    (3, "evidence (rules 1.2): each host's first rank adds host_counters to its records: the checkpoint "
        "folder's block device and, before the op's barrier and after every rank ended it, that device's "
        "bytes read and written and busy time and the page cache's size (/sys/dev/block, /proc/meminfo)"),
    (4, "rules 1.4: every write and read record adds cpu_ns (the rank process's CPU time, user and "
        "system, all threads, over [t0, t1]) and state_bytes/state_huge_bytes (the rank's state "
        "buffer and how much of it transparent huge pages back, from /proc/self/smaps, on the first write "
        "and the first restore)"),
    (5, "rules 1.7: a GPU-source run's write and read records add device_copy_ns (the device-to-host copy "
        "inside a write, the whole memory stage of an async one; the host-to-device copy inside a read)"),
    (6, "rules 1.8: each counters sample adds what the kernel charged to the host's ranks (own_read_bytes, "
        "own_written_bytes from /proc/<pid>/io, own_cpu_ns), the host's busy CPU time (cpu_busy_ns) and how "
        "long the sample took (read_ns); host_counters adds cpus (mlckpt/attribution.py)"),
    (7, "rules 1.10: the records of ops whose timed requests go to the storage through the engine's file "
        "paths (synchronous one-tier writes, restores) add "
        "requests (count, and an HdrHistogram of every request's latency in ns, 1 ns..1 h, 2 significant "
        "digits) and phases_ns (the rank's wall time in open, transfer, fsync, dir_fsync; "
        "mlckpt/latency.py); a witnessed op's rank 0 adds witness_host_ns (its own time from the "
        "witness's answer to the start until t0_ns, and from t1_ns until it sent the end)"),
    (8, "rules 1.11: in a run with a library writer every write and read record adds writer (mlckpt, "
        "torch_save, torch_dcp, safetensors: who wrote or restored its checkpoint), and a library's write "
        "file_bytes (the size on disk of the files it made) and synced_by (library | mlckpt: who fsynced "
        "them inside the op)"),
    (9, "rules 1.13: a serving run's records are one per rank and load: op load, index (the load), rank, "
        "replica, shard, host, strategy, t0_ns/t1_ns (its host's monotonic clock, from leaving the load's "
        "barrier until its shard was in its memory), wall_start, bytes (its shard), storage_bytes, "
        "node_tier_bytes, received_bytes, resident_bytes (its storage files' pages in the page cache when "
        "the load began) and verified_bytes (mlckpt/serving_metrics.py); a checkpoint run's are format 8's"),
    (10, "rules 1.14: a load record adds node_tier_resident_bytes (of the rank's node-tier files, the bytes "
         "still in the page cache just before it read them; 0 without a tier) and the op timer's evidence: "
         "direct, cpu_ns, and on each host's first rank host_counters (as around a checkpoint op); a "
         "checkpoint run's are format 8's"),
    (11, "rules 1.16: a witnessed load's rank 0 record carries witness_host_ns (as a witnessed checkpoint "
         "op's does); every other record is format 10's"),
    (12, "rules 1.19: a library writer's write and read records add tensors (how many tensors the op saved "
         "or loaded: framework.tensors=model, the rank's shard as the model's named tensors; flat, one per "
         "planned file; mlckpt/workload/tensors.py); a fan-out load's records add exchange_cpu_ns (the "
         "CPU time of the rank's thread that drives the exchange, its polls and copies) and "
         "exchange_tail_ns (the exchange's wall time after the rank's last read: what the pipelined "
         "reads did not hide)"),
    (13, "rules 1.21: a resume run's records, op resume: each new rank's resume (index, rank, host, "
         "t0_ns/t1_ns, wall_start, the parts metadata_ns, planning_ns, read_ns, placing_ns; bytes of its "
         "state, read_bytes, index_bytes, needs, reads, tensors, files, resident_bytes, verified_bytes) "
         "and the op timer's evidence, as a load's (mlckpt/run/phases/resumes.py)"),
    (14, "rules 1.22: a resume record names its writer (mlckpt, or torch_dcp: DCP's resharding load, whose "
         "record counts the stored pieces it read whole as reads, their bytes as stored as read_bytes, "
         "DCP's .metadata as index_bytes, and carries no requests: none went through the engine)"),
))

SUMMARY = Format("summary", "summary.json: summary_format", 12, (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12), (
    (1, "first version: per-op statistics and headlines recomputed from records.jsonl (mlckpt.metrics)"),
    (2, "stall, time to durable, overlap efficiency, back-pressure, per-stage bandwidth, read_fast_*"),
    (3, "DLIO's summary.json shape (rules 1.3): dlio_compat becomes metric, under DLIO's key names and "
        "units; start, end, num_accelerators, num_hosts, hostname, host_cpu_count, host_memory_GB, epochs "
        "as DLIO writes them (one entry per host); mlckpt_timing_basis and mlckpt_read_guarantee"),
    (4, "rules 1.4 (records format 4): the first write apart (write_first_duration_s, "
        "write_first_bandwidth_gib_s) and the later ones (write_steady_bandwidth_mean_gib_s, absent "
        "with one write); CPU seconds per GiB moved (write_cpu_s_per_gib, read_cpu_s_per_gib); the smallest "
        "huge-page share of a rank's state buffer (state_hugepage_fraction_min)"),
    (5, "rules 1.8 (records format 6): foreign, what other processes moved on the checkpoint device during "
        "the timed writes and restores (bytes, share, CPU share, the worst op) and between them"),
    (6, "rules 1.10 (records format 7): write_latency_ms and read_latency_ms (count, p50, p90, p99, p99_9, "
        "max of every request), write_iops_mean and read_iops_mean, write_phases and read_phases "
        "(seconds: the slowest rank's time in each phase, mean over ops; mlckpt/latency.py)"),
    (7, "rules 1.11 (records format 8): with a library writer the headline figures are the library's ops' "
        "and framework holds them beside mlckpt's engine's from the same run (reference) with each ratio "
        "library / engine (write_ratio, read_ratio; mlckpt/metrics.py)"),
    (8, "rules 1.13 (records format 9): a serving run's summary has kind serving: the workload, strategy, "
        "replicas, tp, ranks, hosts, each load's figures (ready_s, slowest_rank, the bytes served, placed, "
        "received and read from the node tier, resident_bytes, effective_gb_s, storage_gb_s), the median, "
        "fastest and slowest ready_s, the rates at the median, read_cold and read_verified "
        "(mlckpt/serving_metrics.py); a checkpoint run's is format 7's"),
    (9, "rules 1.14 (records format 10): a serving run's loads add node_tier_resident_bytes, and "
        "node_tier_cold says whether every load read its node tier cold (null: no tier; false: a warm "
        "tier, in memory or the page cache); a checkpoint run's is format 7's"),
    (10, "rules 1.20: the same keys; every rank of an op (and of a load) is timed from its host's first rank "
         "to leave the op's barrier, so each op's duration, bandwidth, stall, time to durable, IOPS and "
         "time to ready runs from the barrier (mlckpt.metrics.from_barrier)"),
    (11, "rules 1.21: the same keys; a resume run's summary, kind resume: the layouts, each resume's time "
         "to resume and its parts' slowest rank, the state and the bytes read, the medians "
         "(mlckpt/resume_metrics.py)"),
    (12, "rules 1.22: a resume run's summary adds writer (whose resumes its figures are), storage_bytes "
         "(what the hosts read from the storage at least; each resume's too, and its writer) and framework "
         "(null, or a library's resumes beside the engine's: their count, median and resume_ratio)"),
))

PLAN = Format("plan", "mlckpt plan --json: plan_format", 2, (2,), (
    (1, "first version (files, bytes and verdict plus totals, restore volumes, hosts, not_checked)"),
    (2, "pipeline (checkpoint mode, stages, fast tier and the space it needs); a host's resident_bytes is "
        "the HOST-MEMORY rule's figure (async staging and tiers included)"),
))

BUNDLE = Format("bundle", "bundle.dsse.json: predicate.bundle_format", "1.0", ("1.0",), (
    ("1.0", "a folder whose regular files are all in-toto Statement v1 subjects (sha256), in a DSSE "
            "envelope with one Ed25519 signature embedding the signer's raw public key; layout and "
            "envelope are described in mlckpt/bundle/__init__.py"),
))

CODE_DIGEST = Format("code digest", "predicate.runner_code_hash_alg", "mlckpt-tree-sha256-v1",
                     ("mlckpt-tree-sha256-v1",), (
    ("mlckpt-tree-sha256-v1", "sha256 over name NUL len NUL content of every file of the installed "
                              "package, sorted by name, data folders as _data/workloads and _data/rules"),
))

TRUSTED_WITNESSES = Format("trusted witnesses", "trusted-witnesses.yaml: mlckpt_trusted_witnesses", "1.0",
                           ("1.0",), (
    ("1.0", "witnesses: witness name -> list of ed25519:<base64> keys, as trusted keys are; defined by "
            "rules/1.4/schemas/trusted-witnesses.schema.json"),
))

TRUSTED_KEYS = Format("trusted keys", "trusted-keys.yaml: mlckpt_trusted_keys", "1.0", ("1.0",), (
    ("1.0", "organizations: organisation -> list of ed25519:<base64> keys; defined by "
            "rules/1.0/schemas/trusted-keys.schema.json"),
))

RELEASED_RUNNERS = Format("released runners", "released-runners.yaml: mlckpt_released_runners", "1.0",
                          ("1.0",), (
    ("1.0", "first version (rules 1.2): runners: list of {version, code_sha256, released, note}; "
            "rules/1.2/schemas/released-runners.schema.json"),
))

RESUME_INDEX = Format("resume index", "a resumable checkpoint's index.json: resume_index_format", 1, (1,), (
    (1, "first version: the writing layout (workload, ranks, tp, pp, zero), its files [writer, index, name, "
        "bytes] and its global tensors [name, dtype, cols, numel, tp_split, copies of pieces [start, numel, "
        "writer, index, offset]] (mlckpt/workload/resume.py)"),
))

PAGE_TAG = Format("page tag", "the 32-byte tag at the start of every 4 KiB page", 1, (1,), (
    (1, "magic MLCK, format u16, reserved u16, run_id u64, rank u32, checkpoint u16, file_index u16, "
        "page_index u64 (little-endian; see mlckpt/engine/content.py)"),
))

DATA_SCHEME = Format("data scheme", "run.json: data_scheme", "aes128ctr-pagetag-v1",
                     ("aes128ctr-pagetag-v1",), (
    ("aes128ctr-pagetag-v1", "AES-128-CTR keystream per run/rank/checkpoint/file with a page tag "
                             "(format 1) on every page"),
))

SYSTEM_DESCRIPTION = Format("system description", "systems/<system>.yaml: description_format", 1, (1,), (
    (1, "first version (rules/1.0/schemas/system-description.schema.json)"),
))

REPORT = Format("check report", "mlckpt-check --json: report_format", 6, (1, 2, 3, 4, 5, 6), (
    (1, "first version (rules/1.0/schemas/report.schema.json)"),
    (2, "rules 1.4: each bundle's witness (null, or by whom, whether counted as witnessed, and the "
        "witness-conservative bandwidths)"),
    (3, "rules 1.8: a bundle's verdict may be disturbed (another process moved a declared share of the "
        "checkpoint device's bytes during its timed ops: neither valid nor invalid); summary.disturbed; exit "
        "status 6 when the worst bundle is disturbed"),
    (4, "rules 1.10: a witnessed bundle's witness.unbounded names the ops the witness bounds only loosely "
        "(each op's duration and how much shorter it could be recorded and still hold)"),
    (5, "rules 1.11: a library writer's bundle's metrics add framework (its figures beside the engine's of "
        "the same run, each ratio; rules/1.11/schemas/report.schema.json)"),
    (6, "rules 1.13: a serving bundle's metrics add serving (strategy, replicas, tp, loads, ready_s median, "
        "min and max, the bytes served and placed, effective_gb_s, storage_gb_s)"),
))

LEADERBOARD = Format("leaderboard", "mlckpt-check leaderboard --format json: leaderboard_format", 7, (7,), (
    (1, "first version: classes by division, workload and scale"),
    (2, "classes split by checkpoint mode; Stall and Time to durable columns"),
    (3, "scaled classes split by scale factor (class scale_factor; ids end -x<factor> with _ for the "
        "point); a split result's lone invocation excluded with verdict 'unpaired'"),
    (4, "each row's verified: false for a published DLIO / mlpstorage result listed with --published "
        "(quoted as published, below the checked results of its class)"),
    (5, "rules 1.11: a library writer's results in classes of their own (checkpoint mode +torch_save, "
        "+torch_dcp, +safetensors); the mode names the writer and its write and read ratios to the engine's "
        "checkpoints of the same run"),
    (6, "rules 1.13: serving results in classes of their own (pipeline serving, ids ending -serving), every "
        "loading strategy in one table, ranked by the time to ready; each class names its sort, and its rows "
        "carry its own columns (a serving class: strategy, replicas, tp, ready_s, effective_gb_s, "
        "storage_gb, storage_gb_s); columns lists every column a table shows"),
    (7, "rules 1.18: a checkpoint row's goodput_pct, its goodput at its rules version's reference job "
        "(null where none is declared, for a split result and for a published one)"),
))

COMPARE = Format("compare", "mlckpt-check compare --json: compare_format", 6, (6,), (
    (1, "first version: two bundles' rows side by side with ratios B/A"),
    (2, "each side says whether it is verified and what it is (an mlckpt bundle, or a DLIO / mlpstorage "
        "result folder: unverified, only the rows it states)"),
    (3, "differences: each way the two results are unlike (workload, scale, rules, division, checkpoint "
        "mode), with A's and B's value"),
    (4, "rules 1.10: write_compute_mean_s, the training interval as measured (each write's shortest across "
        "ranks, mean over the writes; recomputed from the records), beside compute_interval_s as configured"),
    (5, "rules 1.11: framework (the library writer), framework_write_ratio and framework_read_ratio (its "
        "bandwidth over the engine's checkpoints of the same run), where either side has them"),
    (6, "rules 1.13: where either side is a serving result, its loads' rows in place of the checkpoint rows: "
        "strategy, replicas, tp, ready_s_median, ready_s_min, ready_s_max, effective_gb_s, placed_gb, "
        "storage_gb, storage_gb_s"),
))

RUN_OUTCOME = Format("run outcome", "mlckpt run --json: outcome_format", 1, (1,), (
    (1, "first version: one JSON line per launch on stdout (a sweep: one per combination): status and its "
        "word, the overrides, the bundle (null where none was written), verdict, the I/O settings "
        "(io.block_size, io.threads, io.direct) and figures (summary.json's numbers and latency "
        "percentiles); a refusal before any launch: status and error"),
))

WITNESS = Format("witness", "witness journal lines, receipts and transcripts: witness_format", 3, (1, 2, 3), (
    (1, "first version: a journal line per event (seq, kind open|start|end|rtt|close, the witness's "
        "t_wall_ns and t_mono_ns, op and index, a write start's nonce, an end's start_service_ns (how "
        "long the witness took to answer the op's start), the previous line's sha256); "
        "receipts and transcripts are DSSE envelopes of their own payload types; the transcript's schema "
        "is rules/1.4/schemas/witness-transcript.schema.json"),
    (2, "rules 1.10: an open is a DSSE envelope signed by a trusted key over the witness's challenge; the "
        "open entry adds opened_by (that key's keyid) and org (its organisation in the witness's "
        "trusted keys); a run without an event for the witness's bound ends in an expire entry (idle_s); "
        "each start and end adds lag_ns (how late the witness's own loop may have stamped it); "
        "closed runs' journals are archived gzip'ed under closed/; schema "
        "rules/1.10/schemas/witness-transcript.schema.json"),
    (3, "rules 1.16: an event's op may be load (a serving run's loads, counted from 0 as its records "
        "count them); a transcript that holds a load says witness format 3, one that holds none says 2 "
        "as before, so that the rules before 1.16 still check every checkpoint run's transcript; "
        "schema rules/1.16/schemas/witness-transcript.schema.json"),
))

# A witness's transcript with no load in it keeps witness format 2, so that the rules before 1.16
# (whose schemas know formats 1 and 2) check every checkpoint run's transcript as before.
WITNESS_WITHOUT_LOADS = 2

ALL: tuple[Format, ...] = (RUN, RECORDS, SUMMARY, PLAN, BUNDLE, CODE_DIGEST, TRUSTED_KEYS, TRUSTED_WITNESSES,
                           RELEASED_RUNNERS,
                           PAGE_TAG, WITNESS, RESUME_INDEX,
                           DATA_SCHEME, SYSTEM_DESCRIPTION, REPORT, LEADERBOARD, COMPARE)
