"""The leaderboard's model: entries, classes and tables (its columns: ``columns``).  Pure (design: the
package's docstring)."""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from checker.leaderboard.numbers import (
    SUMMARY_NUMBERS,
    foreign_share,
    framework_ratios,
    latency_numbers,
    number,
)
from checker.leaderboard.systems import dig as _get
from checker.leaderboard.systems import sut_facts
from mlckpt import formats
from mlckpt.rules import gpu_source
from mlckpt.units import fmt_bytes
from mlckpt.workload.frameworks import Framework
from mlckpt.workload.model import ModelShape
from mlckpt.workload.pipeline import DURABLE, Pipeline
from mlckpt.workload.resume_run import ResumeRun
from mlckpt.workload.serving_run import ServingRun

LEADERBOARD_FORMAT = formats.LEADERBOARD.version  # history: mlckpt/formats.py
DIVISIONS = ("closed", "open")
SCALES = ("full", "scaled")
# class order
PIPELINES = ("sync", "sync+tiers", "async", "async+tiers", "sync+gpu", "async+gpu", "serving", "resume")
SERVING = "serving"  # a serving run's class (rules 1.13): replicas loading the model, every strategy
RESUME = "resume"  # a resume run's class (rules 1.21): a job resuming at another layout, every pair
ID_DOMAIN = "mlckpt-result-id-v1"


# ----------------------------------------------------------------------------------------------
# Result IDs


def result_id(org: str, system: str, workload: str, run_id: str) -> str:
    digest = hashlib.sha256("\0".join((ID_DOMAIN, org, system, workload, run_id)).encode()).digest()
    code = base64.b32encode(digest).decode("ascii")[:10]
    return f"{code[:5]}-{code[5:]}"


# ----------------------------------------------------------------------------------------------
# One result


@dataclass(frozen=True)
class ClassKey:
    division: str
    workload: str
    scale: str  # "full" | "scaled"
    pipeline: str = "sync"  # Pipeline.label: sync | sync+tiers | async | async+tiers (+gpu: GPU state)
    factor: float = 1.0  # the scale itself: runs scaled ×0.01 and ×0.0125 never share a table

    @property
    def scale_label(self) -> str:
        return "full scale" if self.scale == "full" else f"scaled ×{self.factor:g}"

    @property
    def id(self) -> str:
        # x0_0125 for ×0.0125: ids are HTML ids and CSS selectors, where a '.' would be a class
        scale = "full" if self.scale == "full" else f"x{self.factor:g}".replace(".", "_")
        base = f"{self.division}-{self.workload}-{scale}"
        return base if self.pipeline == "sync" else f"{base}-{self.pipeline.replace('+', '-')}"

    @property
    def title(self) -> str:
        title = f"{self.workload} · {self.scale_label}"
        return title if self.pipeline == "sync" else f"{title} · {self.pipeline}"

    def describe(self) -> str:
        what = {SERVING: "replicas loading its weights", RESUME: "resuming at another layout"}.get(
            self.pipeline, f"{self.pipeline} checkpoints")
        return f"{self.division} division, {self.workload}, {self.scale_label}, {what}"


# A published DLIO / mlpstorage result's Verification: every figure quoted as the folder states it.
UNVERIFIED = ("UNVERIFIED: a published DLIO / mlpstorage result, quoted (rank 0's timing, page cache not "
              "controlled, nothing signed, recomputed or verified)")


@dataclass(frozen=True)
class Entry:
    """A passing result: what the tables, charts and ``compare`` need, read from its bundle."""

    path: str  # the bundle, relative to the tree root (folder or .tar.gz)
    org: str
    system: str
    division: str
    workload: str
    run_id: str
    rules_version: str
    canonical: bool
    model_size: float  # parameters (orders workloads)
    hosts: int
    ranks: int
    accelerator: str | None
    scale: float
    residency: str
    io_mode: str  # direct | buffered | dontcache
    restore: str
    fsync: bool
    num_writes: int
    num_reads: int
    checkpoint_bytes: int
    restore_bytes: int
    read_cold: bool | None
    read_verified: bool | None
    metrics: Mapping[str, float] = field(default_factory=dict)  # summary numbers, nan if absent
    pipeline: str = "sync"  # Pipeline.label
    tiers: tuple[str, ...] = (DURABLE,)  # the write stages, in order (summary.json "tiers")
    compute_interval_s: float = 0.0  # as configured: a floor (PIPELINE-DECLARED); shown measured
    fast_fs: tuple[str, ...] = ()  # the fast tier's filesystem type(s), as the runner measured
    fast_reads: int = 0  # restores not (or not only) from the durable tier
    dp: int | None = None  # data-parallel instances: ranks / (TP × PP)
    sut: tuple[tuple[str, str], ...] = ()  # the system description's facts, as SUT_FIELDS names them
    restored_from: str | None = None  # a read-only invocation: its write invocation's run id
    write_invocation: bool = False  # a write invocation kept for a read-only one (num_reads 0, keep)
    invocations: tuple[str, ...] = ()  # a split result's two bundles (write, read); empty for one invocation
    # Counted as witnessed (rules 1.4): the witness's name, its conservative write/read GiB/s.
    witnessed_by: str | None = None
    witnessed_gib_s: tuple[float, float] = (math.nan, math.nan)  # write, read
    protocol: str = "file"  # MLPerf's Access Protocol: file (POSIX), object (S3)
    unverified: bool = False  # a published DLIO / mlpstorage result (--published): quoted, not checked
    framework: str | None = None  # rules 1.11: the library writer (its own class), None: the engine
    # rules 1.13: a serving run's strategy, replicas and GPUs per replica (pipeline "serving")
    serving: tuple[str, int, int] | None = None
    # rules 1.21: a resume run's written layout (ranks, TP, PP) and its own (TP, PP) (pipeline "resume")
    resume: tuple[int, int, int, int, int] | None = None
    # the request shape that changes the numbers: io.block_size and io.threads (None: not stated)
    io_block_size: int | None = None
    io_threads: int | None = None

    def sut_value(self, key: str) -> str:
        return dict(self.sut).get(key, "")

    @property
    def result_id(self) -> str:
        return result_id(self.org, self.system, self.workload, self.run_id)

    @property
    def scaled(self) -> bool:
        return self.scale != 1.0

    @property
    def class_key(self) -> ClassKey:
        return ClassKey(self.division, self.workload, "scaled" if self.scaled else "full", self.pipeline,
                        self.scale)

    def m(self, key: str) -> float:
        return float(self.metrics.get(key, math.nan))

    @property
    def straggler_ratio(self) -> float:
        vals = [v for v in (self.m("write_straggler_ratio_max"), self.m("read_straggler_ratio_max"))
                if math.isfinite(v)]
        return max(vals) if vals else math.nan

    @property
    def verification(self) -> str:
        if self.unverified:
            return UNVERIFIED
        return self._reads_verified() + self._witness_note()

    def _reads_verified(self) -> str:
        if self.resume is not None:
            return ("every new rank verified, " + ("cold" if self.read_cold else "not cold")
                    if self.read_verified else "not verified")
        if self.serving is not None:
            return ("every replica verified, " + ("cold" if self.read_cold else "not cold")
                    if self.read_verified else "not verified")
        if self.num_reads == 0:
            return "no reads"
        if not self.read_verified:
            return "not verified"
        if self.fast_reads >= self.num_reads:
            return "verified, all from the fast tier"
        text = "verified, cold" if self.read_cold else "verified, not cold"
        if self.fast_reads:
            text += f", {self.fast_reads} of {self.num_reads} from the fast tier"
        return text

    def _witness_note(self) -> str:
        """``; witnessed by NAME (write ≥ x, read ≥ y GiB/s)``, or nothing."""
        if self.witnessed_by is None:
            return ""
        figs = [f"{op} ≥ {v:.2f}" for op, v in zip(("write", "read"), self.witnessed_gib_s, strict=True)
                if math.isfinite(v)]
        return f"; witnessed by {self.witnessed_by}" + (f" ({', '.join(figs)} GiB/s)" if figs else "")

    @property
    def io_text(self) -> str:
        """The I/O settings as the details show them: 'direct, 4 MiB × 4 per rank'."""
        if self.io_block_size is None or self.io_threads is None:
            return self.io_mode
        size = fmt_bytes(self.io_block_size).replace(".00 ", " ")
        return f"{self.io_mode}, {size} × {self.io_threads} per rank"

    @property
    def layouts(self) -> str:
        """A resume run's layouts: '8 (TP 1, PP 1) → 4 (TP 2, PP 1)'."""
        if self.resume is None:
            return ""
        n, tp0, pp0, tp, pp = self.resume
        return f"{n} (TP {tp0}, PP {pp0}) → {self.ranks} (TP {tp}, PP {pp})"

    @property
    def mode(self) -> str:
        if self.resume is not None:
            io = ("O_DIRECT reads" if self.io_mode == "direct" else f"{self.io_mode} reads") + (
                self.io_text.removeprefix(self.io_mode))
            if self.framework is not None:  # its own buffered reads; the engine's beside it, as io says
                ratio = self.m("framework_resume_ratio")
                io = (f"through {self.framework}'s resharding load (buffered reads)"
                      + (f", {ratio:.2f}× the engine's rate in the same run ({io})" if math.isfinite(ratio)
                         else ""))
            return ", ".join([f"resumed at {self.layouts}", io,
                              f"scaled ×{self.scale:g}" if self.scaled else "full scale"])
        if self.serving is not None:
            io = ("O_DIRECT reads" if self.io_mode == "direct" else f"{self.io_mode} reads") + (
                self.io_text.removeprefix(self.io_mode))
            return ", ".join([f"{self.serving[1]} replicas × TP {self.serving[2]}", io,
                              f"scaled ×{self.scale:g}" if self.scaled else "full scale"])
        parts = [self.pipeline, self.residency, self.io_text]
        if self.pipeline.startswith("async") or "tiers" in self.pipeline:  # training overlaps the persist
            # as measured (TRAINING-INTERVAL holds the records to it), never as configured
            parts.insert(1, f"{self.m('write_compute_mean_s'):.2f} s of training per checkpoint")
        if self.restore != "own":
            parts.append(f"restore {self.restore}")
        if not self.fsync:
            parts.append("no fsync")
        if self.framework is not None:  # the library's figures against the engine's of the same run
            ratios = [f"{op} {self.m(f'framework_{op}_ratio'):.2f}×" for op in ("write", "read")
                      if math.isfinite(self.m(f"framework_{op}_ratio"))]
            parts.append(f"through {self.framework}" + (f" ({', '.join(ratios)} the engine's in the same run)"
                                                       if ratios else ""))
        parts.append(f"scaled ×{self.scale:g}" if self.scaled else "full scale")
        return ", ".join(parts)

    def row(self) -> dict[str, object]:
        """The table row: one value per column of its class's columns (:data:`COLUMNS`, or
        :data:`SERVING_COLUMNS`; numbers unrounded)."""
        if self.resume is not None:
            return {"result_id": self.result_id, "organisation": self.org, "system": self.system,
                    "division": self.division, "hosts": self.hosts, "ranks": self.ranks,
                    "accelerator": self.accelerator, "layouts": self.layouts,
                    "resume_s": self.m("ready_s_median"), "resume_gb_s": self.m("rate_gb_s"),
                    "resume_read_gb": self.m("read_bytes") / 1e9, "amplification": self.m("amplification"),
                    "verification": self.verification, "mode": self.mode}
        if self.serving is not None:
            return {"result_id": self.result_id, "organisation": self.org, "system": self.system,
                    "division": self.division, "hosts": self.hosts, "ranks": self.ranks,
                    "accelerator": self.accelerator, "strategy": self.serving[0], "replicas": self.serving[1],
                    "tp": self.serving[2], "ready_s": self.m("ready_s_median"),
                    "effective_gb_s": self.m("effective_gb_s"), "storage_gb": self.m("storage_bytes") / 1e9,
                    "storage_gb_s": self.m("storage_gb_s"), "verification": self.verification,
                    "mode": self.mode}
        return {
            "result_id": self.result_id, "organisation": self.org, "system": self.system,
            "division": self.division, "hosts": self.hosts, "ranks": self.ranks,
            "accelerator": self.accelerator,
            "write_gib_s": self.m("write_bandwidth_mean_gib_s"),
            "write_duration_s": self.m("write_duration_mean_s"),
            "write_first_gib_s": self.m("write_first_bandwidth_gib_s"),
            "read_gib_s": self.m("read_bandwidth_mean_gib_s"),
            "read_duration_s": self.m("read_duration_mean_s"),
            "stall_s": self.m("write_stall_mean_s"),
            "time_to_durable_s": self.m("write_time_to_durable_mean_s"),
            "write_slowest_rank_gib_s": self.m("write_slowest_rank_bandwidth_mean_gib_s"),
            "read_slowest_rank_gib_s": self.m("read_slowest_rank_bandwidth_mean_gib_s"),
            "straggler_ratio": self.straggler_ratio, "verification": self.verification,
            "foreign_pct": 100 * self.m("foreign_share"), "goodput_pct": 100 * self.m("goodput"),
            "mode": self.mode,
        }


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _text(value: object) -> str | None:
    if value is None:
        return None
    text = " ".join(str(value).split())
    return text[:64] if text else None


def model_size(model: Any) -> float:
    """Parameters of a transformer (the workload's formula) to order workloads; nan if unknown."""
    keys = ("hidden_size", "num_layers", "ffn_hidden_size", "vocab_size", "num_attention_heads",
            "num_kv_heads")
    try:
        return float(ModelShape.of_counts({k: int(model[k]) for k in keys}).num_parameters)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return math.nan


def entry_from_docs(path: str, org: str, system: str, run: Mapping[str, Any], config: Mapping[str, Any],
                    summary: Mapping[str, Any], system_doc: Mapping[str, Any],
                    division: str | None = None, goodput: float = math.nan) -> Entry:
    """An :class:`Entry` from a bundle's parsed, schema-valid documents.  ``division``: the one it
    is published in (its folder in the tree; a closed-eligible run may be submitted under open/),
    by default the run's own; ``goodput``: at its rules version's reference job (the records')."""
    io_cfg = config.get("io") or {}
    io_mode = "direct" if io_cfg.get("direct") else "dontcache" if io_cfg.get("dontcache") else "buffered"
    accelerator = _text(config.get("accelerator")) or _text(
        _get(system_doc, "description", "clients", "accelerator"))
    workload = config.get("workload") or {}

    def flag(key: str) -> bool | None:
        v = summary.get(key)
        return v if isinstance(v, bool) else None

    pipe = Pipeline.of(config)
    tiers = summary.get("tiers")
    fast_fs = (_get(run, "pipeline", "fast_fs") or {}) if pipe.tiered else {}
    ops = summary.get("ops") or ()
    fast_reads = sum(1 for o in ops if isinstance(o, Mapping) and o.get("op") == "read"
                     and o.get("tier", DURABLE) != DURABLE)
    parallel = workload.get("parallelism") or {}
    mp = int(parallel.get("tensor") or 1) * int(parallel.get("pipeline") or 1)
    ck = config.get("checkpoint") or {}
    fw = Framework.of(config)
    serving, resume = ServingRun.of(config), ResumeRun.of(config)
    return Entry(
        path=path, org=org, system=system, division=division or str(run["division"]),
        workload=str(run["workload"]), run_id=str(run["run_id"]),
        rules_version=str(run.get("rules_version", "")),
        canonical=bool(workload.get("canonical", False)), model_size=model_size(workload.get("model")),
        hosts=len(run.get("hosts") or ()), ranks=int(run["ranks"]), accelerator=accelerator,
        scale=float(run["scale"]), residency=str(config.get("residency", "full")), io_mode=io_mode,
        restore=str(_get(config, "checkpoint", "restore") or "own"),
        fsync=bool(_get(config, "checkpoint", "fsync")),
        num_writes=int(summary.get("num_writes", 0)), num_reads=int(summary.get("num_reads", 0)),
        checkpoint_bytes=int(summary.get("checkpoint_bytes", 0)),
        restore_bytes=int(summary.get("restore_bytes", 0)),
        read_cold=flag("read_cold"), read_verified=flag("read_verified"),
        metrics={**{k: number(summary.get(k)) for k in SUMMARY_NUMBERS}, **latency_numbers(summary),
                 "foreign_share": foreign_share(summary), **framework_ratios(summary), "goodput": goodput},
        # a GPU stall, a framework's library: each a class of its own
        pipeline=SERVING if serving is not None else RESUME if resume is not None else
        pipe.label + ("+gpu" if gpu_source(config) else "") + (f"+{fw.writer}" if fw.library else ""),
        serving=(serving.strategy, serving.replicas, serving.tp) if serving is not None else None,
        resume=resume.layouts if resume is not None else None,
        io_block_size=_count(io_cfg.get("block_size")), io_threads=_count(io_cfg.get("threads")),
        framework=fw.writer if fw.library else None,
        tiers=tuple(str(t) for t in tiers) if isinstance(tiers, list) else tuple(pipe.stages),
        compute_interval_s=pipe.compute_interval_s,
        fast_fs=tuple(sorted({t for t in (_text(v) for v in fast_fs.values()) if t})),
        fast_reads=fast_reads,
        dp=int(run["ranks"]) // mp if mp and int(run["ranks"]) % mp == 0 else None,
        sut=sut_facts(system_doc.get("description")),
        restored_from=str(_get(run, "restored_from", "run_id")) if _get(run, "restored_from") else None,
        write_invocation=int(summary.get("num_reads", 0)) == 0 and bool(ck.get("keep")),
        protocol="object" if _get(run, "storage", "kind") == "s3" else "file",
    )


# ----------------------------------------------------------------------------------------------
# Tables


@dataclass(frozen=True)
class Excluded:
    path: str
    verdict: str
    rules: tuple[str, ...]  # rule IDs of the blocking findings
    reason: str = ""
