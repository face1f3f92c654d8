"""The resolved configuration as the run reads it: one frozen, typed value built once from the
validated mapping (:func:`mlckpt.plan.config.setup`), so that the phases ask
``settings.checkpoint.folder`` rather than re-read ``config["checkpoint"]["folder"]`` and cast it
where they stand. Pure.

The mapping stays what the bundle's config.yaml records and what the rules judge (they read a
hostile bundle's configuration before they trust it); this value is the runner's view of a
configuration that has passed its schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlckpt.workload.frameworks import Framework
from mlckpt.workload.layout import RestorePattern, restore_pattern
from mlckpt.workload.resume_run import ResumeRun
from mlckpt.workload.serving_run import ServingRun


@dataclass(frozen=True)
class IOSettings:
    direct: bool
    dontcache: bool
    threads: int  # requests in flight per rank
    block_size: int  # bytes per request
    timeout_s: float  # an op still running on any rank after this fails the run
    sample_interval_s: float | None  # the device's counters sampled through each op; None: not

    @classmethod
    def of(cls, io: Mapping[str, Any]) -> IOSettings:
        every = io.get("sample_interval_s")
        return cls(bool(io["direct"]), bool(io["dontcache"]), int(io["threads"]), int(io["block_size"]),
                   float(io["timeout_s"]), None if every is None else float(every))


@dataclass(frozen=True)
class CheckpointSettings:
    folder: str  # a path, or an object store location (mlckpt.run.storage.kinds tells which)
    num_writes: int
    num_reads: int
    keep: bool
    fsync: bool
    restore: RestorePattern  # own (read back what this rank wrote) | repopulate (every replica reloads)
    restore_from: str | None  # a read-only invocation: the write invocation's bundle
    fast_tier: str | None

    @classmethod
    def of(cls, ck: Mapping[str, Any]) -> CheckpointSettings:
        tiers = ck.get("tiers") or {}
        source = ck.get("restore_from")
        return cls(str(ck["folder"]), int(ck["num_writes"]), int(ck["num_reads"]), bool(ck["keep"]),
                   bool(ck["fsync"]), restore_pattern(str(ck["restore"])),
                   None if source in (None, "") else str(source),
                   tiers.get("fast"))

    @property
    def kept(self) -> bool:
        """The checkpoints outlive the run: kept, or a read-only invocation's (its write invocation's)."""
        return self.keep or self.restore_from is not None


@dataclass(frozen=True)
class WitnessSettings:
    url: str | None  # None: the run is not witnessed
    timeout_s: float | None  # per request; None: the client's default
    public_key: str | None  # refuse a witness with any other key
    ca_file: str | None  # certificates to trust for an https witness

    @classmethod
    def of(cls, w: Mapping[str, Any] | None) -> WitnessSettings:
        w = w or {}
        text = lambda k: str(w[k]) if w.get(k) else None  # noqa: E731
        return cls(text("url"), float(w["timeout_s"]) if w.get("timeout_s") else None, text("public_key"),
                   text("ca_file"))


@dataclass(frozen=True)
class Settings:
    workload: str
    division: str
    ranks: int
    scale: float
    rules_version: str
    residency: str  # full | stream
    stream_buffer_bytes: int
    system: str | None  # the vendor's system description (a file), or None
    signing_key: str  # auto | none | a PEM path
    results: Path  # output.root, absolute
    drop_system_cache: bool
    io: IOSettings
    checkpoint: CheckpointSettings
    witness: WitnessSettings
    framework: Framework  # who writes the checkpoints: the engine, or a library writer
    serving: ServingRun | None  # a serving run's loads; None: a checkpoint run
    resume: ResumeRun | None  # a resume run's resumes; None: another kind

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Settings:
        return cls(
            workload=str(config["workload"]["name"]), division=str(config["division"]),
            ranks=int(config["ranks"]), scale=float(config["scale"]),
            rules_version=str(config["rules_version"]), residency=str(config["residency"]),
            stream_buffer_bytes=int(config["stream_buffer_bytes"]),
            system=str(config["system"]) if config.get("system") else None,
            signing_key=str(config["signing"]["key"]), results=Path(config["output"]["root"]).absolute(),
            drop_system_cache=bool(config["cache"]["drop_system"]),
            io=IOSettings.of(config["io"]), checkpoint=CheckpointSettings.of(config["checkpoint"]),
            witness=WitnessSettings.of(config.get("witness")), framework=Framework.of(config),
            serving=ServingRun.of(config), resume=ResumeRun.of(config))

    @property
    def scaled(self) -> bool:
        return self.scale != 1
