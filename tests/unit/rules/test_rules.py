"""Rules 1.1 (1.0 plus rule facts and IO-ENGINE): one passing and one failing case per rule
ID, verdicts, rule data."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

import pytest
import yaml

from mlckpt.errors import ConfigError, RuleError
from mlckpt.plan.config import compose, setup
from mlckpt.resources import workloads_dir
from mlckpt.rules import (
    CHECKS,
    SEVERITIES,
    STAGES,
    Context,
    Evaluation,
    Finding,
    HostSpec,
    host_blocks,
    load_rules,
    override_key,
    verdict,
)
from mlckpt.units import GiB, TiB, fmt_bytes
from mlckpt.workload.layout import PAGE, make_plan
from mlckpt.workload.model import Workload, workload_from_config

RS = load_rules()
P8B_TOTAL = 112_425_623_552


@cache
def _composed(overrides: tuple[str, ...]) -> dict[str, Any]:
    return compose(list(overrides))


@cache
def _setup(overrides: tuple[str, ...]):  # type: ignore[no-untyped-def]
    return setup(list(overrides))


def ctx_of(*overrides: str, hosts: tuple[HostSpec, ...] | None = None, complete: bool = False) -> Context:
    """A context exactly as `mlckpt plan OVERRIDES` builds it; hosts given here stand for the runner's
    own measurements (as its gates make them on each host)."""
    return _setup(tuple(overrides)).context(hosts, complete=complete, measured=hosts is not None)


def raw_ctx(*overrides: str, edits: dict[str, Any] | None = None,
            workload_edit: Callable[[Workload], Workload] | None = None,
            plan: bool = False, hosts: tuple[HostSpec, ...] | None = None,
            complete: bool = False) -> Context:
    """A context built directly, bypassing the schema and the structural gate (to reach values
    that `setup` would refuse earlier)."""
    config = copy.deepcopy(_composed(tuple(overrides)))
    for dotted, value in (edits or {}).items():
        node = config
        *parents, last = dotted.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    w = workload_from_config(config["workload"])
    if workload_edit:
        w = workload_edit(w)
    p = make_plan(w, int(config["ranks"]), float(config["scale"])) if plan else None
    return Context(config, w, tuple(overrides), p, hosts, complete, measured=hosts is not None)


def par(**kw: int) -> Callable[[Workload], Workload]:
    return lambda w: dataclasses.replace(w, parallelism=dataclasses.replace(w.parallelism, **kw))


def model(**kw: int) -> Callable[[Workload], Workload]:
    return lambda w: dataclasses.replace(w, model=dataclasses.replace(w.model, **kw))


def evaluate(ctx: Context) -> Evaluation:
    return RS.evaluate(ctx, ("config", "host"))


def findings_of(ev: Evaluation, rule_id: str) -> list[Finding]:
    return [f for f in ev.findings if f.rule == rule_id]


def pg(nbytes: int) -> int:
    return -(-nbytes // PAGE) * PAGE


P8B_RANK_RESIDENT = pg(2_007_565_312) + pg(12_045_637_632)


S3 = "s3://ckpt/runs"


def hosts8(**kw: Any) -> tuple[HostSpec, ...]:
    return (HostSpec("h0", tuple(range(8)), **kw),)


# ---------------------------------------------------------------------------------------------
# One table of failing cases: (rule ID, context factory, expected messages (exact, first ones)).
# The meta-test below makes a rule without an entry here fail the suite.

MEMORY_FOLDER = ("restores and loads are cold reads from storage, and a folder in memory has none to read "
                 "from (put it on the storage under test; a memory-backed folder can be a checkpoint run's "
                 "fast tier, checkpoint.tiers.fast=..., or a serving run's node tier, serving.node_tier=...)")
NEGATIVE: list[tuple[str, Callable[[], Context], list[str]]] = [
    ("RANKS-MULTIPLE", lambda: raw_ctx("workload=llama3_1t", edits={"ranks": 1000}),
     ["ranks must be a positive multiple of TP·PP = 512; got 1000 (nearest valid: 512 or 1024)"]),
    ("RANKS-MULTIPLE", lambda: raw_ctx("workload=llama3_1t", edits={"ranks": 100}),
     ["ranks must be a positive multiple of TP·PP = 512; got 100 (nearest valid: 512)"]),
    ("RANKS-MULTIPLE", lambda: raw_ctx("workload=llama3_70b", edits={"ranks": 0}),
     ["ranks must be a positive multiple of TP·PP = 8; got 0 (nearest valid: 8)"]),
    ("RANKS-MULTIPLE", lambda: raw_ctx("workload=llama3_70b", edits={"ranks": "64"}),
     ["ranks must be a positive multiple of TP·PP = 8; got 64"]),
    ("ZERO3-PIPELINE", lambda: raw_ctx("workload=llama_405b", "division=open",
                                       workload_edit=par(zero_stage=3)),
     ["ZeRO stage 3 requires pipeline parallelism 1; got PP = 32"]),
    ("LAYERS-PIPELINE", lambda: raw_ctx("workload=llama3_405b", workload_edit=model(num_layers=16)),
     ["num_layers must be at least PP = 32; got 16"]),
    ("SCALE-RANGE", lambda: raw_ctx("division=open", edits={"scale": 0}),
     ["scale must be in (0, 1]; got 0"]),
    ("SCALE-RANGE", lambda: raw_ctx("division=open", edits={"scale": 1.5}),
     ["scale must be in (0, 1]; got 1.5"]),
    ("SCALE-RANGE", lambda: raw_ctx("division=open", edits={"scale": -0.1}),
     ["scale must be in (0, 1]; got -0.1"]),
    ("SCALE-RANGE", lambda: raw_ctx("division=open", edits={"scale": True}),
     ["scale must be in (0, 1]; got True"]),
    ("SCALE-RANGE", lambda: raw_ctx("division=open", edits={"scale": "0.5"}),
     ["scale must be in (0, 1]; got 0.5"]),
    ("COUNTS-POSITIVE", lambda: raw_ctx("division=open", edits={"checkpoint.num_writes": 0}),
     ["a run writes at least one checkpoint and reads zero or more, or (checkpoint.restore_from) restores "
      "another invocation's; expected num_writes >= 1 and num_reads >= 0 (num_writes=0 needs "
      "restore_from), got num_writes=0, num_reads=10"]),
    ("COUNTS-POSITIVE", lambda: raw_ctx("division=open", edits={"checkpoint.num_reads": -1}),
     ["a run writes at least one checkpoint and reads zero or more, or (checkpoint.restore_from) restores "
      "another invocation's; expected num_writes >= 1 and num_reads >= 0 (num_writes=0 needs "
      "restore_from), got num_writes=10, num_reads=-1"]),
    # a read-only invocation writes none and restores at least one
    ("COUNTS-POSITIVE", lambda: raw_ctx("division=open", edits={"checkpoint.restore_from": "x",
                                                                 "checkpoint.num_writes": 0,
                                                                 "checkpoint.num_reads": 0}),
     ["got num_writes=0, num_reads=0"]),
    ("COUNTS-POSITIVE", lambda: raw_ctx("division=open", edits={"checkpoint.restore_from": "x"}),
     ["got num_writes=10, num_reads=10"]),
    ("CLOSED-WORKLOAD", lambda: ctx_of("workload=llama_70b"),
     ["closed runs use a canonical workload unchanged; expected one of llama3_8b, llama3_70b, "
      "llama3_405b, llama3_1t, got llama_70b"]),
    ("CLOSED-WORKLOAD", lambda: ctx_of("workload=llama3_8b", "workload.model.hidden_size=4104"),
     ["closed runs use a canonical workload unchanged; expected workload.model.hidden_size=4096, "
      "got workload.model.hidden_size=4104"]),
    ("CLOSED-WORKLOAD", lambda: ctx_of("workload=llama3_70b", "workload.parallelism.tensor=4"),
     ["closed runs use a canonical workload unchanged; expected workload.parallelism.tensor=8, "
      "got workload.parallelism.tensor=4"]),
    ("CLOSED-WORKLOAD", lambda: ctx_of("workload=llama3_8b", "workload.model.optimizer_datatype=bf16"),
     ["closed runs use a canonical workload unchanged; expected workload.model.optimizer_datatype=fp32, "
      "got workload.model.optimizer_datatype=bf16"]),
    # rules 1.10: in the open division too, a canonical name names its model (not its parallelism)
    ("WORKLOAD-NAME", lambda: ctx_of("division=open", "workload=llama3_70b", "workload.model.num_layers=32"),
     ["a workload named as a canonical one has its model, in every division (a changed model under its "
      "name would be listed as that model): expected workload.model.num_layers=80 for llama3_70b, got "
      "workload.model.num_layers=32 (a changed model takes a name of its own: workload.name=...)"]),
    ("CLOSED-RANKS", lambda: ctx_of("workload=llama3_405b", "ranks=1024"),
     ["closed runs of this workload use exactly 512 ranks; got 1024"]),
    # rules 1.11: a library writer with what it cannot run with (more: test_framework_rules.py)
    ("FRAMEWORK-SCOPE", lambda: ctx_of("division=open", "framework.writer=torch_save", "residency=stream"),
     ["a library writer runs one tier on files, with the whole state in host memory, unwitnessed, writing "
      "and restoring in one invocation (async only through DCP's async_save): expected "
      "framework.writer=torch_save without them, got residency=stream (the whole state)"]),
    # rules 1.13: a serving run (more: tests/unit/rules/test_serving_rules.py)
    ("SERVING-SCOPE", lambda: raw_ctx("division=open", "ranks=4", "serving.strategy=direct", "serving.tp=3"),
     ["a serving run loads one model's weights into whole replicas of serving.tp ranks, from one tier of "
      "storage, on its own: expected a serving run without them, got ranks=4 (whole replicas: a multiple of "
      "serving.tp=3)"]),
    ("RESUME-SCOPE", lambda: raw_ctx("division=open", "ranks=4", "resume.from_ranks=8",
                                     "resume.from_tensor=3", "scale=0.01"),
     ["a resume run reads one checkpoint of a valid written layout into the workload's layout, through the "
      "engine or a library that reshards (DCP), from one tier of storage, on its own: expected a resume run "
      "without them, got "
      "resume.from_ranks=8 (a multiple of from_tensor x from_pipeline = 3)"]),
    ("RESUME-SCOPE", lambda: raw_ctx("division=open", "ranks=4", "resume.from_ranks=8", "scale=0.01",
                                     "checkpoint.mode=async"),
     ["a resume run reads one checkpoint of a valid written layout into the workload's layout, through the "
      "engine or a library that reshards (DCP), from one tier of storage, on its own: expected a resume run "
      "without them, got "
      "checkpoint.mode=async (no checkpoints are written)"]),
    ("RESUME-CLOSED", lambda: ctx_of("ranks=4", "resume.from_ranks=8", "scale=0.01"),
     ["rules 1.22 define no closed resume workload (no canonical pair of layouts): a resume run is an open "
      "result (run it with division=open): expected division=open, got division=closed"]),
    ("RESUME-DIRECT", lambda: raw_ctx("division=open", "ranks=4", "resume.from_ranks=8", "scale=0.01",
                                      "io.direct=false"),
     ["a checkpoint on files is resumed from with O_DIRECT, never through a page cache the new ranks of a "
      "host share: expected io.direct=true (a checkpoint on files), got io.direct=false"]),
    ("SERVING-CLOSED", lambda: ctx_of("ranks=4", "serving.strategy=direct", "serving.tp=2"),
     ["rules 1.13 define no closed serving workload (no canonical replica count or strategy): a serving run "
      "is an open result (run it with division=open): expected division=open, got division=closed"]),
    ("CLOSED-RANKS", lambda: ctx_of("workload=llama3_8b", "ranks=16"),
     ["closed runs of this workload use exactly 8 ranks; got 16"]),
    ("CLOSED-COUNTS", lambda: ctx_of("checkpoint.num_writes=3"),
     ["closed runs use 10 writes and 10 reads; got 3 writes and 10 reads"]),
    ("CLOSED-COUNTS", lambda: ctx_of("workload.checkpoint.num_reads=2"),
     ["closed runs use 10 writes and 10 reads; got 10 writes and 2 reads"]),
    ("CLOSED-PARAMS", lambda: ctx_of("checkpoint.restore=repopulate"),
     ["closed runs keep this parameter at checkpoint.restore=own; got checkpoint.restore=repopulate"]),
    ("CLOSED-PARAMS", lambda: ctx_of("scale=0.5"),
     ["closed runs keep this parameter at scale=1.0; got scale=0.5"]),
    ("CLOSED-PARAMS", lambda: ctx_of("residency=stream"),
     ["closed runs keep this parameter at residency=full; got residency=stream"]),
    ("CLOSED-PARAMS", lambda: ctx_of("checkpoint.fsync=false"),
     ["closed runs keep this parameter at checkpoint.fsync=True; got checkpoint.fsync=False"]),
    ("CLOSED-OVERRIDES", lambda: ctx_of("stream_buffer_bytes=67108864"),
     ["closed runs may only change the checkpoint folder, I/O tunables and host mapping; "
      "'stream_buffer_bytes' is not allowed"]),
    ("CLOSED-RANKS-PER-HOST", lambda: ctx_of("hosts=4"),
     [f"closed runs place at least 4 ranks on every host; host {i} has 2" for i in range(4)]),
    ("CLOSED-RANKS-PER-HOST", lambda: ctx_of("ranks_per_host=3"),
     ["closed runs place at least 4 ranks on every host; host 0 has 3",
      "closed runs place at least 4 ranks on every host; host 1 has 3",
      "closed runs place at least 4 ranks on every host; host 2 has 2"]),
    ("CLOSED-ACCELERATOR-MEMORY", lambda: ctx_of("accelerator=tpu"),
     ["declared accelerator memory × ranks must hold the checkpoint: expected at least an accelerator "
      "from the rules table: a100, h100, h200, b200, gb200, mi300x, mi325x, mi355x, got unknown "
      "accelerator 'tpu'"]),
    ("CLOSED-ACCELERATOR-MEMORY", lambda: ctx_of(complete=True),
     ["declared accelerator memory × ranks must hold the checkpoint: expected at least 104.70 GiB "
      "(declare accelerator=NAME), got no accelerator"]),
    # 1T weights on 8 ranks (TP1 PP1): ~15 TiB of state against 8 × 80 GiB
    ("CLOSED-ACCELERATOR-MEMORY",
     lambda: raw_ctx("workload=llama3_1t", "accelerator=h100", edits={"ranks": 8},
                     workload_edit=par(tensor=1, pipeline=1), plan=True),
     ["got 8 × 80 GiB (h100) = 640.00 GiB"]),
    # the remedy where there is one: a ring of stream_buffer_bytes (256 MiB) per rank fits
    ("HOST-MEMORY", lambda: ctx_of("hosts=2", "host_memory_gib=32"),
     [f"host {i}: host memory must hold the resident state of its ranks: expected at least "
      f"{fmt_bytes(4 * P8B_RANK_RESIDENT)}, got 32.00 GiB available; residency=stream would fit (it "
      f"needs 1.00 GiB)" for i in range(2)]),
    ("HOST-MEMORY", lambda: ctx_of("division=open", hosts=hosts8(mem_available_bytes=100 * GiB)),
     [f"host h0: host memory must hold the resident state of its ranks: expected at least "
      f"{fmt_bytes(8 * P8B_RANK_RESIDENT)}, got 100.00 GiB available; residency=stream would fit (it "
      f"needs 2.00 GiB)"]),
    ("HOST-MEMORY", lambda: ctx_of("division=open", hosts=hosts8(mem_available_bytes=GiB)),
     [f"host h0: host memory must hold the resident state of its ranks: expected at least "
      f"{fmt_bytes(8 * P8B_RANK_RESIDENT)}, got 1.00 GiB available"]),  # and where there is none
    ("MEMORY-FOLDER", lambda: ctx_of("checkpoint.folder=/dev/shm/ck", hosts=hosts8(folder_fs="tmpfs")),
     [f"host h0: {MEMORY_FOLDER}: expected a checkpoint folder on storage, got /dev/shm/ck on tmpfs"]),
    # rules 1.14: a serving run always reads its weights back (1.13 skipped it: num_reads is 0)
    ("MEMORY-FOLDER", lambda: ctx_of("division=open", "serving.strategy=direct", "serving.tp=2",
                                     "checkpoint.folder=/dev/shm/ck", hosts=hosts8(folder_fs="tmpfs")),
     [f"host h0: {MEMORY_FOLDER}: expected a checkpoint folder on storage, got /dev/shm/ck on tmpfs"]),
    ("SERVING-DIRECT", lambda: raw_ctx("division=open", "ranks=4", "serving.strategy=fanout", "serving.tp=2",
                                       "scale=0.01", "io.direct=false"),
     ["a serving run reads its weights from files with O_DIRECT (io.direct=true): buffered, the replicas on "
      "one host share the page cache and a load claims bytes from the storage that it copied from memory: "
      "expected io.direct=true (weights on files), got io.direct=false"]),
    ("DISK-SPACE", lambda: ctx_of(hosts=hosts8(disk_free_bytes=TiB)),
     ["host h0: the checkpoint filesystem needs free space for all checkpoints: expected at least "
      "1.02 TiB, got 1.00 TiB free"]),
    ("DISK-SPACE", lambda: ctx_of("division=open", "checkpoint.num_writes=3",
                                  hosts=hosts8(disk_free_bytes=300 * GiB)),
     ["host h0: the checkpoint filesystem needs free space for all checkpoints: expected at least "
      "314.11 GiB, got 300.00 GiB free"]),
    ("HOST-CLOCK-OFFSET", lambda: ctx_of(hosts=(HostSpec("h0", tuple(range(8)), clock_offset_s=0.0),
                                                HostSpec("h1", tuple(range(8, 16)), clock_offset_s=-1.25))),
     ["host h1: every host's wall clock agrees with rank 0's host's (fix its time sync: NTP, chrony), or its "
      "records fall outside the run: expected within 1 s of rank 0's host, got -1.250 s"]),
    ("OBJECT-STORE-USABLE", lambda: ctx_of(f"checkpoint.folder={S3}", hosts=hosts8(
        store_problem="the bucket ckpt does not exist at http://10.0.0.9:9000 (create it first)")),
     ["host h0: the object store must be reachable from every host, with credentials, its bucket present "
      "and writable (a probe object written, read back and deleted): the bucket ckpt does not exist at "
      "http://10.0.0.9:9000 (create it first)"]),
    ("OBJECT-MODES", lambda: raw_ctx("division=open", f"checkpoint.folder={S3}",
                                     "checkpoint.tiers.fast=/nvme/x"),
     ["a run on object storage is one tier with full residency and fsync on, writes and restores in one "
      "invocation, and is not witnessed (not yet supported there): expected one tier, residency=full, "
      "checkpoint.fsync=true, one invocation, no witness, got checkpoint.tiers.fast=/nvme/x"]),
    ("OBJECT-MODES", lambda: raw_ctx("division=open", f"checkpoint.folder={S3}", "residency=stream",
                                     "checkpoint.fsync=false"),
     ["got residency=stream, checkpoint.fsync=false"]),
    ("OBJECT-MODES", lambda: raw_ctx(f"checkpoint.folder={S3}", "witness.url=http://127.0.0.1:8470"),
     ["got witness.url"]),
    ("GPU-USABLE", lambda: ctx_of("division=open", "state.source=gpu", hosts=hosts8(
        gpu_problem="no CUDA device (torch 2.13.0+cpu, built for CUDA none)")),
     ["host h0: state.source=gpu needs the array library (pip install 'mlckpt[gpu]') and a CUDA device on "
      "every host: no CUDA device (torch 2.13.0+cpu, built for CUDA none)"]),
    ("GPU-MODES", lambda: raw_ctx("division=open", "state.source=gpu", "checkpoint.tiers.fast=/nvme/x"),
     ["a run with its state in GPU memory is sync or async on one tier of files, with full residency, writes "
      "and restores in one invocation, and is not witnessed (what the GPU source carries today): expected "
      "one tier of files, residency=full, one invocation, no witness, got checkpoint.tiers.fast=/nvme/x"]),
    ("GPU-MODES", lambda: raw_ctx("division=open", "state.source=gpu", "residency=stream",
                                  f"checkpoint.folder={S3}"),
     [f"got residency=stream, checkpoint.folder={S3}"]),
    ("GPU-MODES", lambda: raw_ctx("division=open", "state.source=gpu", "witness.url=http://127.0.0.1:8470"),
     ["got witness.url"]),
    ("FOLDER-USABLE", lambda: ctx_of(hosts=hosts8(folder_problem="/ckpt is not writable")),
     ["host h0: the checkpoint folder must be a writable directory holding no foreign files: "
      "/ckpt is not writable"]),
    ("RESULTS-APART", lambda: ctx_of(hosts=hosts8(results_same_fs=True)),
     ["host h0: closed runs keep checkpoints and results on different filesystems (output.root "
      "elsewhere): expected the checkpoint folder and output.root on different filesystems, got one "
      "filesystem"]),
    ("IO-ENGINE", lambda: ctx_of("io.direct=true", hosts=hosts8(direct_ok=False)),
     ["host h0: the I/O mode must work on the checkpoint filesystem of every host: O_DIRECT "
      "(io.direct=true; use io.direct=false on e.g. tmpfs); got refused at ./mlckpt-checkpoints"]),
    ("IO-ENGINE", lambda: ctx_of("io.direct=false", "io.dontcache=true", hosts=hosts8(dontcache_ok=False)),
     ["host h0: the I/O mode must work on the checkpoint filesystem of every host: RWF_DONTCACHE "
      "(io.dontcache=true; Linux 6.14+ and filesystem support); got not supported at ./mlckpt-checkpoints"]),
    # --- asynchronous and tiered checkpointing
    ("CLOSED-PARAMS", lambda: ctx_of("checkpoint.mode=async"),
     ["closed runs keep this parameter at checkpoint.mode=sync; got checkpoint.mode=async"]),
    ("CLOSED-PARAMS", lambda: ctx_of("checkpoint.tiers.fast=/nvme/ckpt"),
     ["closed runs keep this parameter at checkpoint.tiers.fast=None; got checkpoint.tiers.fast=/nvme/ckpt"]),
    # async staging: a second copy of every rank's shard in host memory (8 × 2 × 13.09 GiB)
    ("HOST-MEMORY", lambda: ctx_of("division=open", "checkpoint.mode=async",
                                   hosts=hosts8(mem_available_bytes=200 * GiB)),
     [f"host h0: host memory must hold the resident state of its ranks: expected at least "
      f"{fmt_bytes(16 * P8B_RANK_RESIDENT)}, got 200.00 GiB available"]),
    ("WITNESS-MODE", lambda: raw_ctx("division=open", edits={"checkpoint.mode": "async",
                                                             "witness.url": "http://127.0.0.1:8470"}),
     ["a witnessed run is synchronous on one tier under rules 1.4 (the witness's interval of an "
      "asynchronous write would not be the write's): expected checkpoint.mode=sync with no fast tier, "
      "got checkpoint.mode=async"]),
    ("WITNESS-MODE", lambda: raw_ctx("division=open", edits={"checkpoint.tiers.fast": "/dev/shm/ckpt",
                                                             "witness.url": "http://127.0.0.1:8470"}),
     ["a witnessed run is synchronous on one tier under rules 1.4 (the witness's interval of an "
      "asynchronous write would not be the write's): expected checkpoint.mode=sync with no fast tier, "
      "got checkpoint.mode=sync, checkpoint.tiers.fast=/dev/shm/ckpt"]),
    ("ASYNC-RESIDENCY", lambda: raw_ctx("division=open", edits={"checkpoint.mode": "async",
                                                                "residency": "stream"}),
     ["an asynchronous checkpoint snapshots the resident state into host staging: expected "
      "residency=full with checkpoint.mode=async, got residency=stream"]),
    ("TIERS-DISTINCT", lambda: raw_ctx("division=open",
                                       edits={"checkpoint.tiers.fast": "./mlckpt-checkpoints/fast"}),
     ["the fast tier must be a folder apart from the durable tier (neither inside the other): expected a "
      "fast tier apart from checkpoint.folder=./mlckpt-checkpoints, got "
      "checkpoint.tiers.fast=./mlckpt-checkpoints/fast"]),
    ("TIERS-DISTINCT", lambda: raw_ctx("division=open",
                                       edits={"checkpoint.tiers.fast": "mlckpt-checkpoints/"}),
     ["got checkpoint.tiers.fast=mlckpt-checkpoints/"]),  # the same folder, spelled differently
    ("TIERS-DISTINCT", lambda: raw_ctx("division=open", edits={"checkpoint.folder": "/mnt/ckpt/durable",
                                                               "checkpoint.tiers.fast": "/mnt/ckpt"}),
     ["got checkpoint.tiers.fast=/mnt/ckpt"]),  # the durable tier inside the fast one
    ("TIERS-DISTINCT", lambda: raw_ctx("division=open", edits={"checkpoint.folder": "/mnt/a/../ckpt",
                                                               "checkpoint.tiers.fast": "/mnt/ckpt/fast"}),
     ["got checkpoint.tiers.fast=/mnt/ckpt/fast"]),  # '..' resolved before comparing
    # fast_keep 1 of 10 writes: the newest kept + the one in flight = 2 checkpoints of 8 ranks
    ("TIER-SPACE", lambda: ctx_of("division=open", "checkpoint.tiers.fast=/nvme/ckpt",
                                  hosts=hosts8(fast_free_bytes=200 * GiB)),
     [f"host h0: the fast tier needs free space for the checkpoints it holds at once: expected at least "
      f"{fmt_bytes(16 * P8B_RANK_RESIDENT)} (2 checkpoints), got 200.00 GiB free"]),
    ("TIER-SPACE", lambda: ctx_of("division=open", "checkpoint.tiers.fast=/nvme/ckpt",
                                  "checkpoint.num_writes=1", hosts=hosts8(fast_free_bytes=100 * GiB)),
     [f"host h0: the fast tier needs free space for the checkpoints it holds at once: expected at least "
      f"{fmt_bytes(8 * P8B_RANK_RESIDENT)} (1 checkpoint), got 100.00 GiB free"]),
    ("TIER-USABLE", lambda: ctx_of("division=open", "checkpoint.tiers.fast=/nvme/ckpt",
                                   hosts=hosts8(fast_problem="/nvme/ckpt is not writable")),
     ["host h0: the fast-tier folder must be a writable directory holding no foreign files: "
      "/nvme/ckpt is not writable"]),
]

# Passing cases: the rule is evaluated (not skipped for lack of input) and finds nothing.
POSITIVE: list[tuple[str, Callable[[], Context]]] = [
    ("RANKS-MULTIPLE", lambda: ctx_of("workload=llama3_1t", "ranks=1024")),
    ("RANKS-MULTIPLE", lambda: ctx_of("workload=llama3_405b", "ranks=1536", "division=open")),
    ("ZERO3-PIPELINE", lambda: ctx_of("workload=llama3_70b")),  # ZeRO 3, PP 1
    ("ZERO3-PIPELINE", lambda: ctx_of("workload=llama3_405b")),  # ZeRO 1, PP 32
    ("LAYERS-PIPELINE", lambda: ctx_of("workload=llama3_405b")),
    ("LAYERS-PIPELINE", lambda: ctx_of("workload=llama3_405b", "workload.model.num_layers=32",
                                       "division=open")),  # L == PP
    # the open division may change a canonical workload's parallelism, or its model under a new name
    ("WORKLOAD-NAME", lambda: ctx_of("division=open", "workload=llama3_70b",
                                     "workload.parallelism.tensor=4")),
    ("WORKLOAD-NAME", lambda: ctx_of("division=open", "workload=llama3_70b", "workload.model.num_layers=32",
                                     "workload.name=my_70b_32l")),
    ("FRAMEWORK-SCOPE", lambda: ctx_of("division=open", "framework.writer=torch_dcp",
                                       "checkpoint.mode=async")),
    ("SERVING-SCOPE", lambda: ctx_of("division=open", "ranks=4", "serving.strategy=fanout", "serving.tp=2",
                                     "scale=0.01")),
    ("SERVING-CLOSED", lambda: ctx_of("ranks=8")),  # a checkpoint run
    ("RESUME-SCOPE", lambda: ctx_of("division=open", "ranks=16", "resume.from_ranks=8", "scale=0.01")),
    ("RESUME-SCOPE", lambda: ctx_of("division=open", "ranks=4", "resume.from_ranks=8", "scale=0.01",
                                    "framework.writer=torch_dcp", "workload.parallelism.tensor=2")),
    ("RESUME-CLOSED", lambda: ctx_of("ranks=8")),  # a checkpoint run
    ("RESUME-DIRECT", lambda: ctx_of("division=open", "ranks=4", "resume.from_ranks=8", "scale=0.01")),
    ("RESUME-DIRECT", lambda: ctx_of("division=open", "ranks=4", "resume.from_ranks=8", "scale=0.01",
                                     f"checkpoint.folder={S3}", "io.direct=false")),
    ("SERVING-DIRECT", lambda: ctx_of("division=open", "ranks=4", "serving.strategy=direct", "serving.tp=2")),
    # objects: no page cache of the host's
    ("SERVING-DIRECT", lambda: ctx_of("division=open", "ranks=4", "serving.strategy=direct", "serving.tp=2",
                                      f"checkpoint.folder={S3}", "io.direct=false")),
    ("SERVING-DIRECT", lambda: ctx_of("ranks=8", "io.direct=false")),  # a checkpoint run
    ("SCALE-RANGE", lambda: ctx_of("scale=1.0")),
    ("SCALE-RANGE", lambda: ctx_of("scale=0.01", "division=open")),
    ("SCALE-RANGE", lambda: raw_ctx("division=open", edits={"scale": 1})),
    ("COUNTS-POSITIVE", lambda: ctx_of("checkpoint.num_writes=1", "checkpoint.num_reads=0",
                                       "division=open")),
    ("COUNTS-POSITIVE", lambda: ctx_of("checkpoint.num_writes=2", "checkpoint.num_reads=5",
                                       "division=open")),
    ("COUNTS-POSITIVE", lambda: raw_ctx("division=open", edits={"checkpoint.restore_from": "x",
                                                                 "checkpoint.num_writes": 0})),
    *[("CLOSED-WORKLOAD", (lambda n=n: ctx_of(f"workload={n}")))
      for n in ("llama3_8b", "llama3_70b", "llama3_405b", "llama3_1t")],
    ("CLOSED-RANKS", lambda: ctx_of("workload=llama3_405b", "ranks=512")),
    ("CLOSED-RANKS", lambda: ctx_of("workload=llama3_1t")),
    ("CLOSED-COUNTS", lambda: ctx_of("checkpoint.num_writes=10", "checkpoint.num_reads=10")),
    ("CLOSED-PARAMS", lambda: ctx_of("scale=1.0", "checkpoint.restore=own", "residency=full")),
    ("CLOSED-OVERRIDES", lambda: ctx_of("checkpoint.folder=/mnt/ckpt", "io.threads=8", "io.direct=false",
                                        "io.block_size=1048576", "hosts=2", "accelerator=h100",
                                        "host_memory_gib=512", "cache.drop_system=true",
                                        "output.root=/tmp/r", "checkpoint.keep=true",
                                        "checkpoint.rank_shift=0", "rules_version=\"1.0\"")),
    ("CLOSED-RANKS-PER-HOST", lambda: ctx_of("hosts=2")),
    ("CLOSED-RANKS-PER-HOST", lambda: ctx_of("workload=llama3_405b", "ranks_per_host=8")),
    ("CLOSED-ACCELERATOR-MEMORY", lambda: ctx_of("accelerator=h100")),
    ("CLOSED-ACCELERATOR-MEMORY", lambda: ctx_of("workload=llama3_1t", "accelerator=H100", complete=True)),
    ("HOST-MEMORY", lambda: ctx_of("hosts=2", "host_memory_gib=64")),
    # stream residency holds at most stream_buffer_bytes per rank
    ("HOST-MEMORY", lambda: ctx_of("division=open", "hosts=2", "host_memory_gib=2", "residency=stream")),
    ("DISK-SPACE", lambda: ctx_of(hosts=hosts8(disk_free_bytes=2 * TiB))),
    ("DISK-SPACE", lambda: ctx_of(hosts=hosts8(disk_free_bytes=10 * P8B_TOTAL))),  # exactly enough
    ("FOLDER-USABLE", lambda: ctx_of(hosts=hosts8(folder_problem=None))),
    ("MEMORY-FOLDER", lambda: ctx_of(hosts=hosts8(folder_fs="ext4"))),
    ("MEMORY-FOLDER", lambda: ctx_of("checkpoint.num_reads=0", "checkpoint.keep=true",
                                     hosts=hosts8(folder_fs="tmpfs"))),  # a write invocation reads nothing
    ("OBJECT-STORE-USABLE", lambda: ctx_of(f"checkpoint.folder={S3}", hosts=hosts8(store_problem=None))),
    # a folder run: a problem measured for a store the run does not use is no finding
    ("OBJECT-STORE-USABLE", lambda: ctx_of(hosts=hosts8(store_problem="no S3 credentials found"))),
    ("OBJECT-MODES", lambda: ctx_of("division=open", f"checkpoint.folder={S3}", "checkpoint.mode=async")),
    ("OBJECT-MODES", lambda: ctx_of("division=open", "residency=stream")),  # files: any residency
    ("GPU-USABLE", lambda: ctx_of("division=open", "state.source=gpu", hosts=hosts8(gpu_problem=None))),
    # host memory: a GPU problem measured on a host is no finding for a run that does not use one
    ("GPU-USABLE", lambda: ctx_of(hosts=hosts8(gpu_problem="no CUDA device"))),
    ("GPU-MODES", lambda: ctx_of("division=open", "state.source=gpu", "checkpoint.mode=async")),
    ("GPU-MODES", lambda: ctx_of("division=open", "residency=stream")),  # host memory: any residency
    ("HOST-CLOCK-OFFSET", lambda: ctx_of(hosts=(HostSpec("h0", tuple(range(8)), clock_offset_s=0.0),
                                                HostSpec("h1", tuple(range(8, 16)), clock_offset_s=0.999)))),
    ("RESULTS-APART", lambda: ctx_of(hosts=hosts8(results_same_fs=False))),
    ("IO-ENGINE", lambda: ctx_of("io.direct=true", hosts=hosts8(direct_ok=True))),
    ("IO-ENGINE", lambda: ctx_of("io.direct=false", hosts=hosts8(direct_ok=False))),  # not asked for
    ("ASYNC-RESIDENCY", lambda: ctx_of("division=open", "checkpoint.mode=async")),  # residency=full
    ("WITNESS-MODE", lambda: ctx_of("witness.url=http://127.0.0.1:8470")),  # sync, one tier
    ("WITNESS-MODE", lambda: ctx_of("division=open", "checkpoint.mode=async")),  # not witnessed
    ("ASYNC-RESIDENCY", lambda: ctx_of("division=open", "residency=stream")),  # sync: any residency
    ("TIERS-DISTINCT", lambda: ctx_of("division=open", "checkpoint.tiers.fast=/dev/shm/ckpt")),
    # a sibling whose name merely starts with the durable folder's name is apart from it
    ("TIERS-DISTINCT", lambda: ctx_of("division=open", "checkpoint.tiers.fast=./mlckpt-checkpoints-fast")),
    ("TIERS-DISTINCT", lambda: ctx_of("division=open")),  # one tier
    ("TIER-SPACE", lambda: ctx_of("division=open", "checkpoint.tiers.fast=/nvme/ckpt",  # exactly enough
                                  hosts=hosts8(fast_free_bytes=16 * P8B_RANK_RESIDENT))),
    ("TIER-SPACE", lambda: ctx_of("division=open", hosts=hosts8(fast_free_bytes=0))),  # one tier
    ("TIER-USABLE", lambda: ctx_of("division=open", "checkpoint.tiers.fast=/nvme/ckpt",
                                   hosts=hosts8(fast_problem=None))),
    # one tier: a problem measured for a folder the run does not use is no finding
    ("TIER-USABLE", lambda: ctx_of("division=open", hosts=hosts8(fast_problem="/nvme is not writable"))),
]


def _ids(table: Sequence[tuple[Any, ...]]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for row in table:
        seen[row[0]] = seen.get(row[0], 0) + 1
        out.append(f"{row[0]}-{seen[row[0]]}")
    return out


@pytest.mark.parametrize(("rule_id", "make", "messages"), NEGATIVE, ids=_ids(NEGATIVE))
def test_rule_fails(rule_id: str, make: Callable[[], Context], messages: list[str]) -> None:
    ctx = make()
    rule = RS.rule(rule_id)
    assert ctx.division in rule.divisions
    found = findings_of(evaluate(ctx), rule_id)
    assert found, f"{rule_id} did not fire"
    assert {f.severity for f in found} == {rule.severity}
    got = [f.message for f in found]
    if len(messages) > 1:
        assert got[: len(messages)] == messages
    elif messages[0].startswith("got "):
        assert messages[0] in got[0]
    else:
        assert got[0] == messages[0]


@pytest.mark.parametrize(("rule_id", "make"), POSITIVE, ids=_ids(POSITIVE))
def test_rule_passes(rule_id: str, make: Callable[[], Context]) -> None:
    ctx = make()
    assert ctx.division in RS.rule(rule_id).divisions
    ev = evaluate(ctx)
    assert findings_of(ev, rule_id) == []
    assert rule_id not in {r for r, _ in ev.not_checked}, "rule was skipped, not passed"


PRE_IO_RULES = {
    "RANKS-MULTIPLE", "ZERO3-PIPELINE", "LAYERS-PIPELINE", "SCALE-RANGE", "COUNTS-POSITIVE",
    "CLOSED-WORKLOAD", "CLOSED-RANKS", "CLOSED-COUNTS", "CLOSED-PARAMS", "CLOSED-OVERRIDES",
    "CLOSED-RANKS-PER-HOST", "CLOSED-ACCELERATOR-MEMORY", "HOST-MEMORY", "DISK-SPACE", "FOLDER-USABLE",
    "IO-ENGINE", "RESULTS-APART", "MEMORY-FOLDER", "WORKLOAD-NAME",
    "ASYNC-RESIDENCY", "TIERS-DISTINCT", "TIER-SPACE", "TIER-USABLE", "WITNESS-MODE", "HOST-CLOCK-OFFSET",
    "OBJECT-MODES", "OBJECT-STORE-USABLE", "GPU-MODES", "GPU-USABLE", "FRAMEWORK-SCOPE", "SERVING-SCOPE",
    "SERVING-CLOSED", "SERVING-DIRECT", "RESUME-SCOPE", "RESUME-DIRECT", "RESUME-CLOSED"}


def test_every_pre_io_rule_has_a_failing_and_a_passing_case() -> None:
    pre_io = {r.id for r in load_rules().rules if set(r.stages) & {"config", "host"}}
    assert pre_io == PRE_IO_RULES
    assert pre_io <= {rid for rid, _, _ in NEGATIVE}, "a rule has no failing-case test"
    assert pre_io <= {rid for rid, _ in POSITIVE}, "a rule has no passing-case test"


def test_every_rule_has_a_failing_case() -> None:
    # Rules judged on a finished run or a submission tree (stages result/submission) have their
    # failing cases in tests/e2e/test_checker.py (NEGATIVE_CASES, with its own every-rule check);
    # every other rule, including any added later, needs one in NEGATIVE above.
    here = {rid for rid, _, _ in NEGATIVE}
    for r in load_rules().rules:
        assert r.id in here or set(r.stages) <= {"result", "submission"}, (
            f"rule {r.id} (stages {', '.join(r.stages)}) has no failing-case test: add one to NEGATIVE")


def test_findings_carry_expected_and_actual() -> None:
    [f] = findings_of(evaluate(ctx_of("workload=llama3_405b", "ranks=1024")), "CLOSED-RANKS")
    assert (f.expected, f.actual) == (512, 1024)
    assert f.to_dict() == {"rule": "CLOSED-RANKS", "severity": "open", "expected": 512, "actual": 1024,
                           "message": "closed runs of this workload use exactly 512 ranks; got 1024"}


# ---------------------------------------------------------------------------------------------
# Applicability, skipping, and details of individual checks.

def test_default_closed_plan_has_no_findings() -> None:
    ev = evaluate(ctx_of("workload=llama3_1t"))
    assert ev.findings == ()
    assert {r for r, _ in ev.not_checked} == {
        "CLOSED-RANKS-PER-HOST", "CLOSED-ACCELERATOR-MEMORY", "HOST-MEMORY", "DISK-SPACE", "FOLDER-USABLE",
        "TIER-SPACE", "TIER-USABLE", "IO-ENGINE", "RESULTS-APART", "MEMORY-FOLDER",
        "HOST-CLOCK-OFFSET", "OBJECT-STORE-USABLE", "GPU-USABLE"}  # measured by the runner's gates only


def test_closed_rules_do_not_apply_to_open_division() -> None:
    ctx = ctx_of("workload=llama_70b", "division=open", "ranks=128", "checkpoint.num_writes=3",
                 "stream_buffer_bytes=67108864", "residency=stream", "scale=0.1", "hosts=64")
    ev = evaluate(ctx)
    assert ev.findings == ()
    assert verdict(ev.findings, "open") == "open"


def test_closed_ranks_not_checked_for_non_canonical_workload() -> None:
    ev = evaluate(ctx_of("workload=llama_405b"))
    assert ("CLOSED-RANKS", "not a canonical workload (see CLOSED-WORKLOAD)") in ev.not_checked
    assert [f.rule for f in ev.findings] == ["CLOSED-WORKLOAD"]


def test_closed_overrides_leave_workload_and_own_rules_to_other_rules() -> None:
    ev = evaluate(ctx_of("workload.model.hidden_size=4104", "checkpoint.num_writes=3", "scale=0.5"))
    assert sorted(f.rule for f in ev.findings) == ["CLOSED-COUNTS", "CLOSED-PARAMS", "CLOSED-WORKLOAD",
                                                  "WORKLOAD-NAME"]  # rules 1.10: a changed model's name


def test_a_witness_is_allowed_in_a_closed_run_from_rules_1_15() -> None:
    witnessed = ("witness.url=http://witness.example:8470", "witness.timeout_s=10")
    ctx = ctx_of(*witnessed)
    assert ctx.division == "closed" and RS.version == "1.22"
    assert not findings_of(evaluate(ctx), "CLOSED-OVERRIDES")
    old = load_rules("1.14").evaluate(ctx_of(*witnessed, "rules_version=1.14"), ("config", "host"))
    refused = [f.actual for f in findings_of(old, "CLOSED-OVERRIDES")]
    assert refused == ["'witness.url'", "'witness.timeout_s'"]


@pytest.mark.parametrize(("override", "key"), [
    ("io.threads=8", "io.threads"), ("++io.threads=8", "io.threads"), ("+foo=1", "foo"),
    ("~cache", "cache"), ("workload=llama3_8b", "workload"), ("workload@x=llama3_8b", "workload"),
])
def test_override_key(override: str, key: str) -> None:
    assert override_key(override) == key


def test_accelerator_memory_skipped_when_undeclared_outside_runner() -> None:
    ev = evaluate(ctx_of())
    assert ("CLOSED-ACCELERATOR-MEMORY", "accelerator not declared (give accelerator=NAME)") in ev.not_checked


def test_accelerator_memory_boundary() -> None:
    # 8 ranks × a100 (80 GiB) easily hold llama3_8b's 104.70 GiB
    [outcome] = [CHECKS["accelerator_memory"](ctx_of("accelerator=a100"), RS,
                                              RS.rule("CLOSED-ACCELERATOR-MEMORY"))]
    assert outcome.ok and outcome.expected == "104.70 GiB"
    assert outcome.actual == "8 × 80 GiB (a100) = 640.00 GiB"


def test_host_memory_counts_repopulate_and_shift() -> None:
    # 405B on 64 hosts × 8 ranks, 80 GiB each.  Hosts 0..31 hold dp 0 (model + optimizer states);
    # hosts 32..63 hold dp 1 (optimizer states only, ~70.9 GiB).
    base = ("workload=llama3_405b", "division=open", "ranks_per_host=8", "host_memory_gib=80")
    failing = lambda *o: sorted(int(f.message.split(":")[0].split()[1])  # noqa: E731
                                for f in findings_of(evaluate(ctx_of(*base, *o)), "HOST-MEMORY"))
    assert failing("checkpoint.rank_shift=0") == list(range(32))
    # repopulate: dp 1 ranks also restore the model states of their dp 0 peer
    assert failing("checkpoint.rank_shift=0", "checkpoint.restore=repopulate") == list(range(64))
    # auto shift = 8 ranks per host: the last host restores ranks 0..7 (dp 0) and needs their size
    assert failing() == [*range(32), 63]


RING = 2 * 4 * 4 * 1024 * 1024  # the drain's buffer per rank: 2 blocks × io.threads (4) × 4 MiB
STREAM = 268_435_456  # default stream_buffer_bytes


@pytest.mark.parametrize(("overrides", "fast_fs", "need"), [
    ((), None, 8 * P8B_RANK_RESIDENT),
    # async: each rank stages a full copy of its shard beside its state
    (("checkpoint.mode=async",), None, 16 * P8B_RANK_RESIDENT),
    # a fast tier on disk: only the drain ring, per rank (unknown filesystem: not counted as memory)
    (("checkpoint.tiers.fast=/nvme/ckpt",), "ext4", 8 * P8B_RANK_RESIDENT + 8 * RING),
    (("checkpoint.tiers.fast=/nvme/ckpt",), None, 8 * P8B_RANK_RESIDENT + 8 * RING),
    # a tmpfs fast tier holds 2 checkpoints of the host's 8 ranks (fast_keep 1 + the one in flight)
    (("checkpoint.tiers.fast=/dev/shm/ckpt",), "tmpfs", 24 * P8B_RANK_RESIDENT + 8 * RING),
    (("checkpoint.mode=async", "checkpoint.tiers.fast=/dev/shm/ckpt"), "tmpfs",
     32 * P8B_RANK_RESIDENT + 8 * RING),
    (("checkpoint.mode=async", "checkpoint.tiers.fast=/dev/shm/ckpt"), "ramfs",
     32 * P8B_RANK_RESIDENT + 8 * RING),
    (("checkpoint.mode=async", "checkpoint.tiers.fast=/nvme/ckpt"), "xfs", 16 * P8B_RANK_RESIDENT + 8 * RING),
    # fast_keep 3 of 10 writes: 4 checkpoints at once; ring from io.threads=8 × 1 MiB blocks
    (("checkpoint.mode=async", "checkpoint.tiers.fast=/dev/shm/ckpt", "checkpoint.tiers.fast_keep=3",
      "io.threads=8", "io.block_size=1048576"), "tmpfs", 48 * P8B_RANK_RESIDENT + 8 * 2 * 8 * 1048576),
    # fast_keep 3 but only 2 writes: never more than 2 on the tier
    (("checkpoint.mode=async", "checkpoint.tiers.fast=/dev/shm/ckpt", "checkpoint.tiers.fast_keep=3",
      "checkpoint.num_writes=2"), "tmpfs", 32 * P8B_RANK_RESIDENT + 8 * RING),
    # stream residency bounds the state, not the tmpfs tier (which holds whole checkpoints)
    (("residency=stream", "checkpoint.tiers.fast=/dev/shm/ckpt"), "tmpfs",
     8 * STREAM + 8 * RING + 16 * P8B_RANK_RESIDENT),
])
def test_host_memory_counts_staging_ring_and_memory_tier(overrides: tuple[str, ...], fast_fs: str | None,
                                                          need: int) -> None:
    """HOST-MEMORY's requirement to the byte: met with exactly ``need`` available, not one byte less."""
    rule = RS.rule("HOST-MEMORY")

    def outcome(mem: int) -> Any:
        ctx = ctx_of("division=open", *overrides, hosts=hosts8(mem_available_bytes=mem, fast_fs=fast_fs))
        [o] = CHECKS["host_memory"](ctx, RS, rule)
        return o

    enough, short = outcome(need), outcome(need - 1)
    assert (enough.ok, short.ok) == (True, False)
    assert short.expected == enough.expected == fmt_bytes(need)
    assert short.where == "host h0"


def test_plan_refuses_async_without_residency_and_nested_tiers() -> None:
    """ASYNC-RESIDENCY and TIERS-DISTINCT are structural: `mlckpt plan` refuses before any plan."""
    with pytest.raises(RuleError) as exc:
        setup(["division=open", "checkpoint.mode=async", "residency=stream"])
    assert exc.value.rule == "ASYNC-RESIDENCY"
    with pytest.raises(RuleError) as exc:
        setup(["division=open", "checkpoint.folder=/mnt/ckpt", "checkpoint.tiers.fast=/mnt/ckpt/fast"])
    assert exc.value.rule == "TIERS-DISTINCT"
    assert str(exc.value).endswith("got checkpoint.tiers.fast=/mnt/ckpt/fast")


def test_host_memory_not_checked_without_memory() -> None:
    ev = evaluate(ctx_of("hosts=2"))
    assert ("HOST-MEMORY", "host memory unknown (give host_memory_gib=)") in ev.not_checked


def test_require_structure_raises_rule_error() -> None:
    with pytest.raises(RuleError) as exc:
        RS.require_structure(raw_ctx("workload=llama3_1t", edits={"ranks": 1000}))
    assert exc.value.rule == "RANKS-MULTIPLE"
    assert str(exc.value) == ("[RANKS-MULTIPLE] ranks must be a positive multiple of TP·PP = 512; "
                              "got 1000 (nearest valid: 512 or 1024)")
    with pytest.raises(RuleError) as exc:
        RS.require_structure(raw_ctx("workload=llama_405b", workload_edit=par(zero_stage=3)))
    assert exc.value.rule == "ZERO3-PIPELINE"
    # resource and closed-eligibility rules are not structural
    RS.require_structure(ctx_of("hosts=2", "host_memory_gib=1", "checkpoint.num_writes=3"))


def test_host_blocks() -> None:
    assert host_blocks(8, None, None) is None
    assert host_blocks(8, 2, None) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert host_blocks(8, 3, None) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert host_blocks(10, None, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


# ---------------------------------------------------------------------------------------------
# Verdicts.

def _f(severity: str) -> Finding:
    return Finding("X", severity, "m")


@pytest.mark.parametrize(("severities", "division", "expected"), [
    ([], "closed", "closed"),
    ([], "open", "open"),
    (["warning"], "closed", "closed"),
    (["warning"], "open", "open"),
    (["open"], "closed", "open"),
    (["open", "warning"], "closed", "open"),
    (["invalid"], "closed", "invalid"),
    (["open", "invalid"], "closed", "invalid"),
    (["invalid", "open"], "open", "invalid"),
])
def test_verdict(severities: list[str], division: str, expected: str) -> None:
    assert verdict([_f(s) for s in severities], division) == expected


def test_verdict_end_to_end() -> None:
    assert verdict(evaluate(ctx_of("workload=llama3_8b")).findings, "closed") == "closed"
    assert verdict(evaluate(ctx_of("workload=llama3_405b", "ranks=1024")).findings, "closed") == "open"
    invalid = evaluate(ctx_of("workload=llama3_405b", "ranks=1024", "hosts=2", "host_memory_gib=1"))
    assert sorted(f.rule for f in invalid.findings) == ["CLOSED-RANKS", "HOST-MEMORY", "HOST-MEMORY"]
    assert verdict(invalid.findings, "closed") == "invalid"


# ---------------------------------------------------------------------------------------------
# The rule data itself.

CANONICAL_TABLE = {  # the canonical table: hidden, layers, ffn, vocab, heads, kv heads, TP, PP, ZeRO, ranks
    "llama3_8b": (4096, 32, 14336, 128256, 32, 8, 1, 1, 3, 8),
    "llama3_70b": (8192, 80, 28672, 128256, 128, 8, 8, 1, 3, 64),
    "llama3_405b": (16384, 126, 53248, 128256, 128, 8, 8, 32, 1, 512),
    "llama3_1t": (25872, 128, 98304, 128256, 192, 32, 8, 64, 1, 1024),
}


def _workload_yaml(name: str) -> dict[str, Any]:
    return yaml.safe_load((workloads_dir() / "workload" / f"{name}.yaml").read_text(encoding="utf-8"))


def test_canonical_workloads_agree_with_workload_configs() -> None:
    canon = RS.canonical_workloads
    assert sorted(canon) == sorted(CANONICAL_TABLE)
    canonical_files = sorted(p.stem for p in (workloads_dir() / "workload").glob("*.yaml")
                             if _workload_yaml(p.stem).get("canonical"))
    assert canonical_files == sorted(canon)
    for name, want in canon.items():
        node = _workload_yaml(name)
        assert node["name"] == name
        assert node["closed_ranks"] == want["closed_ranks"]
        assert node["model"] == want["model"]
        assert node["parallelism"] == want["parallelism"]
        m, p = want["model"], want["parallelism"]
        assert (m["hidden_size"], m["num_layers"], m["ffn_hidden_size"], m["vocab_size"],
                m["num_attention_heads"], m["num_kv_heads"], p["tensor"], p["pipeline"],
                p["zero_stage"], want["closed_ranks"]) == CANONICAL_TABLE[name]
        assert (m["model_datatype"], m["optimizer_datatype"], m["type"]) == ("fp16", "fp32", "transformer")
        assert node["checkpoint"] == {"num_writes": 10, "num_reads": 10, "fsync": True}


def test_rule_data_is_well_formed() -> None:
    ids = [r.id for r in RS.rules]
    assert len(ids) == len(set(ids))
    for r in RS.rules:
        assert r.severity in SEVERITIES
        assert set(r.stages) <= set(STAGES) and r.stages
        assert set(r.divisions) <= {"closed", "open"} and r.divisions
        assert r.check in CHECKS
        assert "{actual}" in r.message
    assert RS.version == "1.22"
    assert RS.closed["num_writes"] == RS.closed["num_reads"] == 10
    assert RS.closed["min_ranks_per_host"] == 4
    assert {k: RS.accelerators[k] for k in ("h100", "h200", "b200", "mi300x", "mi355x")} == {
        "h100": 80, "h200": 141, "b200": 180, "mi300x": 192, "mi355x": 288}


def test_structural_rules_are_invalid_in_every_division() -> None:
    for rid in ("RANKS-MULTIPLE", "ZERO3-PIPELINE", "LAYERS-PIPELINE", "SCALE-RANGE", "COUNTS-POSITIVE"):
        r = RS.rule(rid)
        assert (r.severity, set(r.divisions), r.stages) == ("invalid", {"closed", "open"}, ("config",))


def test_load_rules_unknown_version() -> None:
    with pytest.raises(ConfigError) as exc:
        load_rules("9.9")
    assert str(exc.value) == ("rules_version: unknown rules version '9.9'; known: 1.0, 1.1, 1.2, 1.3, 1.4, "
                              "1.5, 1.6, 1.7, 1.8, 1.9, 1.10, 1.11, 1.12, 1.13, 1.14, 1.15, 1.16, 1.17, "
                              "1.18, 1.19, 1.20, 1.21, 1.22, mlps-v3.0, mlps-v3.0r2, mlps-v3.0r3, "
                              "mlps-v3.0r4, mlps-v3.0r5")
    assert exc.value.key == "rules_version"
    assert exc.value.exit_status == 2


@pytest.mark.parametrize("overrides", [("division=open", "hosts=2", "ranks_per_host=2"),
                                       ("division=open", "hosts=16")])
def test_declared_host_mapping_places_every_rank_once(overrides: tuple[str, ...]) -> None:
    try:
        ctx = ctx_of(*overrides)
    except ConfigError:
        return  # refusing the mapping is fine too
    assert ctx.hosts is not None
    assert sorted(r for h in ctx.hosts for r in h.ranks) == list(range(8))
    assert all(h.ranks for h in ctx.hosts)
