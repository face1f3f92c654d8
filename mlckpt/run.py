"""The MPI runner: gates, write phase, cache eviction, read phase, records.  Effects on MPI.

Every rank runs ``Runner.run``.  Each step that can fail locally ends in a collective
``_agree``: if any rank failed, every rank raises the same error (rank 0 prints it), so no rank
waits forever in a barrier.  Timing is per rank on its host's monotonic clock between leaving a
barrier and its last byte being durable (writes) or read (reads); metrics take the max over ranks.

Two guards cover ranks that never get to an agreement.  A rank that stalls (a hung syscall, dead
storage): every timed op is watched by a thread on rank 0 (``_OpWatch``, ``io.timeout_s``), which
names the late ranks, removes this run's files and aborts the MPI job.  A rank that dies (SIGKILL,
the OOM killer): mpiexec then kills every rank, so rank 0's ``Guardian`` process, forked before
MPI starts, names the rank that died first and removes this run's files.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import select
import shutil
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from mlckpt import __version__, bundle, engine
from mlckpt.config import Setup, setup
from mlckpt.errors import InternalError, IOFailure, MlckptError, UsageError, VerificationError
from mlckpt.metrics import RECORDS_FORMAT, dlio_compat, summarize
from mlckpt.pipeline import DURABLE, FAST, MEMORY, MEMORY_FILESYSTEMS, Pipeline
from mlckpt.result_checks import DATA_SCHEME, RunData
from mlckpt.rules import HostSpec, rank_shift, verdict
from mlckpt.sizing import PAGE, pages
from mlckpt.sysdesc import load_system_description
from mlckpt.sysinfo import disk_free_bytes, existing_ancestor, host_facts, mem_available_bytes, mount_of
from mlckpt.units import GiB, fmt_bytes

# Format history of run.json (the bundle manifest written by the runner):
#   1: first version: run identity, status, workload, division, scaled, verdict, findings,
#      overrides, host mapping, timings, file list.
#   2: ``pipeline``: checkpoint mode, compute interval, fast tier (folder, fast_keep, filesystem
#      type per host); records format 2.
RUN_FORMAT = 2
RUN_MARKER = ".mlckpt-run"  # marks a checkpoint run folder as ours (see folder gate)
BAR_AFTER_S = 3.0  # show a progress bar inside an op that takes longer than this
ABORT_GRACE_S = 0.5  # between printing a fatal line and MPI_Abort (see _stalled)
WATCH_POLL_S = 0.01  # how often rank 0's op watch looks for the other ranks' "done"
_DONE_TAG = 7  # tag of the "done" messages, on the runner's private duplicate communicator


@dataclass
class Failure:
    rank: int
    host: str
    kind: str
    message: str
    status: int


class CollectiveFailure(MlckptError):
    """Some rank failed a step; carries the first failure (lowest rank)."""

    def __init__(self, failures: list[Failure]) -> None:
        first = failures[0]
        n = len(failures) - 1
        more = f" (and {n} more rank{'s' if n > 1 else ''})" if n else ""
        # Bad input is the same on every rank: name the problem, not a rank.
        where = "" if first.status == 2 else f"rank {first.rank} on {first.host}: "
        super().__init__(f"{where}{first.message}{more}")
        self.exit_status = first.status
        self.failures = failures


@dataclass
class Runner:
    comm: Any
    overrides: list[str]
    out: Any = field(default=sys.stdout)
    guardian: Guardian | None = None  # rank 0 only (see Guardian)

    def __post_init__(self) -> None:
        self.rank: int = self.comm.Get_rank()
        self.size: int = self.comm.Get_size()
        self.host = socket.gethostname()
        self.log_lines: list[str] = []
        self.created_files: list[str] = []
        self.created_dirs: list[Path] = []
        self.wcomm: Any = None  # private duplicate of comm for the op watch's messages

    # ------------------------------------------------------------------ collective helpers
    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        self._note(step=what)
        err: BaseException | None = None
        try:
            yield
        except MlckptError as exc:
            err = exc
        except Exception as exc:  # a defect or an unexpected OS error: still agree, then stop
            err = InternalError(f"{what}: {type(exc).__name__}: {exc}")
        self._agree(err)

    def _agree(self, err: BaseException | None) -> None:
        mine = None
        if err is not None:
            mine = (type(err).__name__, str(err), getattr(err, "exit_status", 1))
        allerr = self.comm.allgather(mine)
        failures = [Failure(r, "", e[0], e[1], e[2]) for r, e in enumerate(allerr) if e]
        if failures:
            hosts = self.comm.allgather(self.host)
            for f in failures:
                f.host = hosts[f.rank]
            raise CollectiveFailure(failures)

    def say(self, line: str) -> None:
        """Rank 0 prints and logs."""
        if self.rank == 0:
            stamp = datetime.now(timezone.utc).strftime("%H:%M:%S")
            self.log_lines.append(f"{stamp} {line}")
            print(line, file=self.out, flush=True)

    def _note(self, **msg: Any) -> None:
        """Rank 0 tells its guardian what is going on (a pipe write, never inside a timed region)."""
        if self.guardian is not None:
            self.guardian.send(**msg)

    # ------------------------------------------------------------------ the run
    def run(self) -> Path | None:
        started = _now()
        with self.step("configuration"):
            self.setup = self._configure()
            self.pipe = Pipeline.of(self.setup.config)
        cfg = self.setup.config
        self.say(f"mlckpt {__version__}: {cfg['workload']['name']} on {self.size} ranks, division "
                 f"{cfg['division']}{', scaled × ' + str(cfg['scale']) if cfg['scale'] != 1 else ''}, "
                 f"{fmt_bytes(self.setup.plan.total_bytes)} per checkpoint, "
                 f"{cfg['checkpoint']['num_writes']} writes, {cfg['checkpoint']['num_reads']} reads")
        hosts, facts = self._gates()
        with self.step("signing key"):
            # After the gates (a refused run writes nothing, not even a new key), before any I/O.
            if self.rank == 0 and self.signing_key is None:
                self.signing_key = resolve_signing_key(str(cfg["signing"]["key"]), self.say)
        try:
            records = self._phases(hosts)
        finally:
            self._cleanup()
        if self.rank != 0:
            return None
        return self._write_bundle(records, hosts, facts, started)

    def _configure(self) -> Setup:
        ovs = list(self.overrides)
        given = [o for o in ovs if o.split("=", 1)[0].lstrip("+") == "ranks"]
        if not given:
            ovs.append(f"ranks={self.size}")
        s = setup(ovs)
        self.description = None
        self.signing_key = None
        if self.rank == 0 and s.config.get("system"):
            # Before any I/O: a bad description must not cost a whole run.
            self.description = load_system_description(s.config["system"], s.rules.version)
        if self.rank == 0:  # nor an output folder the result could never be written to
            problem = output_problem(Path(s.config["output"]["root"]).absolute())
            if problem:
                raise UsageError(f"output.root: {problem}", key="output.root")
            if str(s.config["signing"]["key"]) not in ("auto", "none"):  # nor a key that won't load
                self.signing_key = resolve_signing_key(str(s.config["signing"]["key"]), self.say)
        if s.plan.ranks != self.size:
            raise UsageError(f"ranks={s.plan.ranks} but the MPI world has {self.size} ranks "
                             "(drop ranks= under mpiexec, or match -n)", key="ranks")
        self.overrides = ovs
        return s

    # ------------------------------------------------------------------ gates (before any I/O)
    def _gates(self) -> tuple[tuple[HostSpec, ...], list[dict[str, Any]]]:
        cfg = self.setup.config
        folder = Path(cfg["checkpoint"]["folder"]).absolute()
        names = self.comm.allgather(self.host)
        # The life pipe: its write end closes when this process dies, which rank 0's guardian
        # sees at once (it opens the read end through /proc).  Both ends stay open for good.
        self._life = os.pipe()
        pids = self.comm.allgather((os.getpid(), self._life[0]))
        self.rank_hosts = names
        self._note(ranks=[[r, pid, h, fd] for r, ((pid, fd), h) in enumerate(zip(pids, names, strict=True))],
                   host=self.host)
        order = list(dict.fromkeys(names))
        leader = names.index(self.host) == self.rank
        local: dict[str, Any] | None = None
        with self.step("host measurement"):
            if leader:
                local = {
                    "host": self.host,
                    "mem_available_bytes": mem_available_bytes(),
                    "disk_free_bytes": disk_free_bytes(folder),
                    "folder_problem": folder_problem(folder),
                    "direct_ok": None, "dontcache_ok": None,
                    "facts": host_facts(folder, _mpi_library()),
                    **fast_tier_facts(self.pipe.fast, folder),
                }
                if local["folder_problem"] is None:
                    probe_dir = str(existing_ancestor(folder))
                    if cfg["io"]["direct"]:
                        local["direct_ok"] = engine.probe_direct(probe_dir)
                    elif cfg["io"]["dontcache"]:
                        local["dontcache_ok"] = engine.probe_dontcache(probe_dir)
        measured = [m for m in self.comm.allgather(local) if m]
        by_host = {m["host"]: m for m in measured}
        hosts = tuple(
            HostSpec(h, tuple(r for r, n in enumerate(names) if n == h),
                     by_host[h]["mem_available_bytes"], by_host[h]["disk_free_bytes"],
                     by_host[h]["folder_problem"], by_host[h]["fast_free_bytes"],
                     by_host[h]["fast_problem"], by_host[h]["fast_fs"])
            for h in order)
        self.fast_direct = {m["host"]: bool(m["fast_direct_ok"]) for m in measured}
        self.fast_fs = {m["host"]: m["fast_fs"] for m in measured}
        with self.step("gates"):
            self._judge(hosts, measured)
        return hosts, [m["facts"] for m in measured]

    def _judge(self, hosts: tuple[HostSpec, ...], measured: list[dict[str, Any]]) -> None:
        """Every rank evaluates the same rules on the same data, so every host refuses alike."""
        s = self.setup
        ctx = s.context(hosts, complete=True)
        ev = s.rules.evaluate(ctx, ["config", "host"])
        self.findings = ev.findings
        self.verdict = verdict(ev.findings, str(s.config["division"]))
        refusal = blocking_message(ev.findings, str(s.config["division"]))
        if refusal:
            raise UsageError(refusal)
        for m in measured:
            if m["direct_ok"] is False:
                raise UsageError(
                    f"[IO-ENGINE] host {m['host']}: io.direct=true but the filesystem at "
                    f"{s.config['checkpoint']['folder']} refuses O_DIRECT (e.g. tmpfs); "
                    "use io.direct=false", key="io.direct")
            if m["dontcache_ok"] is False:
                raise UsageError(
                    f"[IO-ENGINE] host {m['host']}: io.dontcache=true but RWF_DONTCACHE is not "
                    "supported here (Linux 6.14+ and filesystem support needed)", key="io.dontcache")
        self.shift = rank_shift(ctx)

    # ------------------------------------------------------------------ phases
    def _phases(self, hosts: tuple[HostSpec, ...]) -> list[dict[str, Any]]:
        s, cfg = self.setup, self.setup.config
        plan = s.plan
        ck = cfg["checkpoint"]
        opts = engine.IOOptions(direct=cfg["io"]["direct"], dontcache=cfg["io"]["dontcache"],
                                threads=cfg["io"]["threads"], block_size=cfg["io"]["block_size"],
                                fsync=ck["fsync"])
        key = self.comm.bcast(secrets.token_bytes(engine.KEY_BYTES) if self.rank == 0 else None)
        self.run_id = int.from_bytes(key[:8], "little")
        self.run_name = self.comm.bcast(_run_name(cfg, self.run_id) if self.rank == 0 else None)
        root = Path(ck["folder"]).absolute() / self.run_name
        self.ckpt_root = root
        self.timeout_s = float(cfg["io"]["timeout_s"])
        self.wcomm = self.comm.Dup()
        # The op watch calls MPI from a second thread on rank 0: only with MPI_THREAD_MULTIPLE.
        from mpi4py import MPI

        self.watching = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
        if not self.watching:
            self.say("warning: this MPI library does not provide MPI_THREAD_MULTIPLE: io.timeout_s is "
                     "not enforced (a stalled rank will hang the job)")
        leader = next(h for h in hosts if self.rank in h.ranks).ranks[0] == self.rank
        with self.step("checkpoint folder"):
            if leader:
                # Folders this run creates (the configured folder too, if missing) are removed at
                # the end when empty; pre-existing ones are never touched.
                missing = [p for p in (root.parent, *root.parent.parents) if not p.exists()]
                self.created_dirs.extend(missing)
                if self.rank == 0:  # before the first mkdir: the guardian can undo all of it
                    self._note(run=str(root), keep=bool(ck["keep"]), dirs=[str(d) for d in missing],
                               names=[[f.name for f in rp.files] for rp in plan.rank_plans],
                               partial=str(Path(cfg["output"]["root"]).absolute()
                                           / f".{self.run_name}.partial"))
                root.mkdir(parents=True, exist_ok=True)
                (root / RUN_MARKER).touch()
                self.created_dirs.append(root)
        mine = plan.rank_plans[self.rank].files
        reads = plan.restore_reads(self.rank, ck["restore"], self.shift)
        stream = cfg["residency"] == "stream"
        with self.step("memory allocation"):
            own_offsets = _offsets([f.bytes for f in mine])
            read_offsets = _offsets([rd.file.bytes for rd in reads])
            if stream:  # a bounded ring instead of the whole state (open division)
                arena = engine.alloc(int(cfg["stream_buffer_bytes"]))
            else:
                arena = engine.alloc(max(own_offsets[-1], read_offsets[-1], PAGE))
        if stream:
            self.say("residency=stream: content generation (writes) and verification (reads) run "
                     "inside the timed region; results are labelled stream")
        nw, nr = int(ck["num_writes"]), int(ck["num_reads"])
        w = _Writes(root=root, fast_root=self._fast_root(leader), mine=mine, offsets=own_offsets,
                    arena=arena, key=key, opts=opts, stream=stream, leader=leader)
        records = self._write_phase(w, nw)
        with self.step("cache eviction after writes"):
            for path in self.created_files:
                # Fast-tier copies no longer kept are gone already; every other file must be there.
                if w.fast_root is None or not path.startswith(f"{w.fast_root}/") or os.path.exists(path):
                    engine.evict(path)
            if cfg["cache"]["drop_system"] and leader:
                engine.drop_caches()
            if leader and w.fast_root is not None:  # every persist is over: drop emptied folders
                for j in set(range(1, nw + 1)) - set(self.pipe.fast_retained(nw)):
                    with suppress(OSError):
                        (w.fast_root / f"ckpt-{j:04d}").rmdir()
            _test_flip(self.rank, root / "ckpt-0001", [f.name for f in mine])
            _test_fast_flip(self.rank, "restore", nw, w.fast_root, [f.name for f in mine])
            _test_corrupt(self.rank, root, plan)
        scratch = engine.alloc(engine.VERIFY_SCRATCH_BYTES)
        writer_hosts = {self.rank_hosts[rd.writer] for rd in reads}
        for k in range(1, nr + 1):
            c = (k - 1) % nw + 1
            tier = self.pipe.restore_tier(c, nw, writer_hosts, self.host)
            ropts = self._fast_opts(opts) if tier == FAST else opts
            cdir = (w.fast_root if tier == FAST else root) / f"ckpt-{c:04d}"  # type: ignore[operator]
            paths = [str(cdir / rd.file.name) for rd in reads]
            nbytes = sum(rd.file.bytes for rd in reads)
            with self.step(f"evict before restore {k}"):
                resident = 0
                for path in paths:
                    engine.evict(path)
                for path in paths:
                    resident += engine.resident_bytes(path)[0]
            if stream:
                sfiles = [engine.StreamFile(p, rd.file.bytes,
                                            engine.PageId(self.run_id, rd.writer, c, rd.index))
                          for p, rd in zip(paths, reads, strict=True)]
                rec = self._timed("read", k, c, partial(engine.read_stream, sfiles, key, ropts, arena),
                                  nbytes, len(reads), ropts)
                rec.update(resident_bytes=resident, cached_check_bytes=nbytes, verified_bytes=nbytes,
                           mismatches=0, tier=tier)
                records += self._collect(rec, "read", k, nr, plan.restore_bytes(ck["restore"]))
                continue
            files = [engine.FileIO(p, arena[read_offsets[i]:read_offsets[i + 1]], rd.file.bytes)
                     for i, (p, rd) in enumerate(zip(paths, reads, strict=True))]
            rec = self._timed("read", k, c, partial(engine.read_files, files, ropts), nbytes, len(reads),
                              ropts)
            rec["resident_bytes"] = resident
            rec["cached_check_bytes"] = nbytes
            rec["tier"] = tier
            with self.step(f"verify restore {k}"):
                rec["verified_bytes"] = 0
                rec["mismatches"] = 0
                for fio, rd in zip(files, reads, strict=True):
                    pid = engine.PageId(self.run_id, rd.writer, c, rd.index)
                    bad = engine.verify(fio.buf, fio.nbytes, key, pid, scratch)
                    if bad is not None:
                        rec["mismatches"] += 1
                        raise VerificationError(
                            f"read {k}: verification failed reading {fio.path}: {bad.describe()}",
                            rank=self.rank, file=fio.path, offset=bad.offset)
                    rec["verified_bytes"] += fio.nbytes
            records += self._collect(rec, "read", k, nr, plan.restore_bytes(ck["restore"]))
        del arena
        return records

    # ------------------------------------------------------------------ the write phase
    def _fast_root(self, leader: bool) -> Path | None:
        """This run's folder on the fast tier (created by each host's leader), or None."""
        if self.pipe.fast is None:
            return None
        froot = Path(self.pipe.fast).absolute() / self.run_name
        with self.step("fast-tier folder"):
            if leader:
                missing = [p for p in (froot.parent, *froot.parent.parents) if not p.exists()]
                self.created_dirs.extend(missing)
                if self.rank == 0:
                    self._note(fast_run=str(froot), fast_dirs=[str(d) for d in missing])
                froot.mkdir(parents=True, exist_ok=True)
                (froot / RUN_MARKER).touch()
                self.created_dirs.append(froot)
        self.fast_ckpt_root = froot
        return froot

    def _prepare(self, w: _Writes, k: int) -> None:
        """Checkpoint k's content (new bytes in every page) and folders; untimed.  Collective."""
        with self.step(f"prepare checkpoint {k}"):
            if not w.stream:
                for i, f in enumerate(w.mine):
                    view = w.arena[w.offsets[i]:w.offsets[i + 1]]
                    engine.fill(view, f.bytes, w.key, engine.PageId(self.run_id, self.rank, k, i))
            if w.leader:
                for base in (w.root, w.fast_root):
                    if base is not None:
                        cdir = base / f"ckpt-{k:04d}"
                        cdir.mkdir(exist_ok=True)
                        self.created_dirs.append(cdir)
        for base in (w.root, w.fast_root):
            if base is not None:
                self.created_files += [str(base / f"ckpt-{k:04d}" / f.name) for f in w.mine]

    def _write_to(self, w: _Writes, k: int, base: Path, buf: Any, opts: engine.IOOptions) -> None:
        """Write checkpoint k's files of this rank from ``buf`` (the state or its staging copy)
        under ``base``, every file and the folder fsynced."""
        cdir = base / f"ckpt-{k:04d}"
        paths = [str(cdir / f.name) for f in w.mine]
        dirs = [str(cdir)] if opts.fsync else []
        if w.stream:
            sfiles = [engine.StreamFile(p, f.bytes, engine.PageId(self.run_id, self.rank, k, i))
                      for i, (p, f) in enumerate(zip(paths, w.mine, strict=True))]
            engine.write_stream(sfiles, w.key, opts, buf, dir_fsync=dirs)
        else:
            files = [engine.FileIO(p, buf[w.offsets[i]:w.offsets[i + 1]], f.bytes)
                     for i, (p, f) in enumerate(zip(paths, w.mine, strict=True))]
            engine.write_files(files, opts, dir_fsync=dirs)

    def _fast_opts(self, opts: engine.IOOptions) -> engine.IOOptions:
        """The fast tier's I/O: O_DIRECT when asked for and the fast filesystem takes it."""
        direct = opts.direct and self.fast_direct.get(self.host, False)
        return replace(opts, direct=direct, dontcache=False)

    def _persist(self, w: _Writes, k: int) -> list[dict[str, Any]]:
        """Checkpoint k's background stages (in the background thread): the persist from staging
        (async), the verified drain fast → durable (tiers), then the fast-tier copies no longer
        kept are removed (untimed).  Returns the stage entries."""
        pipe, bg = self.pipe, replace(w.opts, pool="background")
        stages: list[dict[str, Any]] = []
        nbytes = sum(f.bytes for f in w.mine)
        if pipe.mode == "async":
            tier = FAST if pipe.tiered else DURABLE
            base = w.fast_root if pipe.tiered else w.root
            o = self._fast_opts(bg) if pipe.tiered else bg
            t0 = time.perf_counter_ns()
            self._write_to(w, k, base, w.staging, o)  # type: ignore[arg-type]
            stages.append({"tier": tier, "t0_ns": t0, "t1_ns": time.perf_counter_ns(), "bytes": nbytes,
                           "direct": o.direct})
        if pipe.tiered:
            assert w.fast_root is not None and w.ring is not None
            fdir = w.fast_root / f"ckpt-{k:04d}"
            pid = partial(engine.PageId, self.run_id, self.rank, k)
            sfiles = [engine.StreamFile(str(fdir / f.name), f.bytes, pid(i)) for i, f in enumerate(w.mine)]
            cdir = w.root / f"ckpt-{k:04d}"
            _test_fast_flip(self.rank, "drain", k, w.fast_root, [f.name for f in w.mine])
            t0 = time.perf_counter_ns()
            res = engine.drain(sfiles, [str(cdir / f.name) for f in w.mine], w.key, self._fast_opts(bg), bg,
                               w.ring, dir_fsync=[str(cdir)] if bg.fsync else [])
            t1 = time.perf_counter_ns()
            if res.mismatch is not None:
                path, m = res.mismatch
                raise VerificationError(f"drain of checkpoint {k}: the fast tier gave back other bytes "
                                        f"than were written, reading {path}: {m.describe()}",
                                        rank=self.rank, file=path, offset=m.offset)
            stages.append({"tier": DURABLE, "t0_ns": t0, "t1_ns": t1, "bytes": nbytes, "direct": bg.direct,
                           "verified_bytes": res.verified_bytes, "mismatches": 0})
        return stages

    def _evict_fast(self, w: _Writes, k: int) -> None:
        """Once checkpoint k is durable: remove this rank's fast-tier copies no longer kept.  Run
        by the background thread after it reported k durable (housekeeping is not part of the
        persist, and the next fast write queues behind it, so the fast tier never holds more
        than Pipeline.fast_peak_checkpoints)."""
        for j in self.pipe.evict_after(k):
            for f in w.mine:
                with suppress(FileNotFoundError):
                    os.unlink(w.fast_root / f"ckpt-{j:04d}" / f.name)  # type: ignore[operator]

    def _write_phase(self, w: _Writes, nw: int) -> list[dict[str, Any]]:
        """The checkpoints, as training sees them.  Each checkpoint: a barrier (the training step
        all ranks reach), then the stall: wait for the previous checkpoint's background work if it
        is still running (back-pressure), then the blocking stage (sync: the durable write;
        async: the snapshot into staging; sync with tiers: the fast-tier write).  The background
        stages then run in this rank's background thread while it "trains" for
        checkpoint.compute_interval_s (the next checkpoint's content is made in that interval).
        After the last checkpoint, a final wait until it is durable.  Rank 0 gathers the records
        once every checkpoint is durable."""
        pipe = self.pipe
        nbytes = sum(f.bytes for f in w.mine)
        if pipe.mode == "async":
            with self.step("staging allocation"):
                w.staging = engine.alloc(max(w.offsets[-1], PAGE))
        if pipe.tiered:
            with self.step("drain buffer allocation"):
                w.ring = engine.alloc(pipe.drain_ring_bytes(w.opts.threads, w.opts.block_size))
        bg = _Background() if pipe.background else None
        if bg is not None and self.rank == 0:
            self.say(f"checkpoint.mode={pipe.label}: training waits for the {pipe.blocking} stage; "
                     f"{' then '.join(pipe.background)} run{'s' if len(pipe.background) == 1 else ''} in the "
                     f"background during {pipe.compute_interval_s:g} s of training per checkpoint")
        mine: list[dict[str, Any]] = []
        self._prepare(w, 1)
        try:
            for k in range(1, nw + 1):
                info: dict[str, Any] = {}

                def settle(info: dict[str, Any] = info) -> None:
                    """Wait for the previous checkpoint's background work: its records complete."""
                    if bg is None or not bg.pending:
                        info["wait_ns"] = 0
                        return
                    t = time.perf_counter_ns()
                    done = bg.done()  # already finished: no wait at all
                    stages = bg.wait()
                    end = time.perf_counter_ns()
                    durable = stages[-1]["t1_ns"]
                    # The stall counts the whole wait (thread wake-up included); the persist's
                    # exposed part is only the wait before it became durable.
                    info["wait_ns"] = 0 if done else end - t
                    prev = mine[-1]
                    prev["stages"] += stages
                    prev["t1_ns"] = durable
                    prev["exposed_ns"] = 0 if done else max(0, min(end, durable) - t)

                def blocking(k: int = k, info: dict[str, Any] = info) -> None:
                    settle()
                    fast = pipe.blocking == FAST
                    opts = self._fast_opts(w.opts) if fast else w.opts
                    t0 = time.perf_counter_ns()
                    if pipe.blocking == MEMORY:
                        engine.snapshot(w.staging, w.arena, w.offsets[-1], w.opts.threads)
                    else:
                        self._write_to(w, k, w.fast_root if fast else w.root, w.arena, opts)  # type: ignore[arg-type]
                    t1 = time.perf_counter_ns()
                    info["stage"] = {"tier": pipe.blocking, "t0_ns": t0, "t1_ns": t1, "bytes": nbytes}
                    if pipe.blocking != MEMORY:
                        info["stage"]["direct"] = opts.direct
                    if bg is not None:
                        bg.submit(partial(self._persist, w, k),
                                  after=partial(self._evict_fast, w, k) if pipe.tiered else None)

                rec = self._timed("write", k, k, blocking, nbytes, len(w.mine), w.opts)
                if bg is None:  # sync, one tier: the stage is the whole op, barrier to durable
                    info["stage"].update(t0_ns=rec["t0_ns"], t1_ns=rec["t1_ns"])
                rec.update(mode=pipe.mode, staged_ns=rec["t1_ns"], backpressure_ns=info["wait_ns"],
                           exposed_ns=0, compute_ns=0, stages=[info["stage"]])
                mine.append(rec)
                if bg is None:
                    self._report_write(rec, k, nw)
                else:
                    self._report_stall(rec, k, nw)
                # Training: the next checkpoint's content is made, then the rest of the interval.
                if k < nw:
                    self._prepare(w, k + 1)
                rest = rec["staged_ns"] + int(pipe.compute_interval_s * 1e9) - time.perf_counter_ns()
                if rest > 0:
                    time.sleep(rest / 1e9)
                rec["compute_ns"] = time.perf_counter_ns() - rec["staged_ns"]
            if bg is not None:
                self._timed("drain", nw, nw, settle, nbytes, len(w.mine), w.opts)
        finally:
            if bg is not None:
                bg.close()
        records = self.comm.gather(mine, root=0)
        if self.rank != 0:
            return []
        flat = sorted((r for rank_recs in records for r in rank_recs), key=lambda r: (r["index"], r["rank"]))
        if bg is not None:
            for k in range(1, nw + 1):
                self._report_durable([r for r in flat if r["index"] == k], k, nw)
        return flat

    def _report_write(self, rec: dict[str, Any], k: int, nw: int) -> None:
        self._collect(rec, "write", k, nw, self.setup.plan.total_bytes, keep=False)

    def _report_stall(self, rec: dict[str, Any], k: int, nw: int) -> None:
        recs = self.comm.gather(rec, root=0)
        if self.rank != 0:
            return
        stall = max(r["staged_ns"] - r["t0_ns"] for r in recs) / 1e9
        wait = max(r["backpressure_ns"] for r in recs) / 1e9
        self.say(f"checkpoint {k}/{nw}: training stalled {stall:.3f} s ({self.pipe.blocking}"
                 + (f"; {wait:.3f} s of it waiting for checkpoint {k - 1}" if wait > 0 else "") + ")")

    def _report_durable(self, recs: list[dict[str, Any]], k: int, nw: int) -> None:
        moved = sum(r["bytes"] for r in recs)
        ttd = max(r["t1_ns"] - r["t0_ns"] for r in recs) / 1e9
        dur = max(st["t1_ns"] - st["t0_ns"] for r in recs for st in r["stages"]
                  if st["tier"] == DURABLE) / 1e9
        self.say(f"checkpoint {k}/{nw}: durable {ttd:.2f} s after it was taken; durable-tier write "
                 f"{fmt_bytes(moved)} in {dur:.2f} s = {moved / dur / GiB:.2f} GiB/s")

    def _timed(self, op: str, index: int, ckpt: int, action: Callable[[], Any], nbytes: int,
               nfiles: int, opts: engine.IOOptions) -> dict[str, Any]:
        """One timed op on this rank (``action``), after a barrier; every rank agrees on failure.

        The op is watched (io.timeout_s): each rank reports "done" to rank 0 after taking t1, and
        a thread on rank 0 aborts the job if some rank has not reported by the deadline."""
        action = _test_fault(self.rank, op, index, action)
        self._note(step=f"{op} {index}", ckpt=ckpt)
        watch = _OpWatch(self, op, index, ckpt) if self.rank == 0 and self.watching else None
        sent = None
        try:
            self.comm.Barrier()
            wall = time.time()
            bar = _ProgressBar(self, op, index, nbytes) if self.rank == 0 else None
            t0 = time.perf_counter_ns()
            err: BaseException | None = None
            try:
                action()
            except engine.StreamMismatch as exc:
                err = VerificationError(
                    f"{op} {index}: verification failed reading {exc.path}: {exc.mismatch.describe()}",
                    rank=self.rank, file=exc.path, offset=exc.mismatch.offset)
            except IOFailure as exc:
                err = IOFailure(f"{op} {index}: {exc}", op=exc.op, path=exc.path, errno=exc.errno,
                                offset=exc.offset)
            except MlckptError as exc:
                err = exc
            except Exception as exc:
                err = InternalError(f"{op} {index}: {type(exc).__name__}: {exc}")
            t1 = time.perf_counter_ns()
            # Timing is over: tell rank 0's watch that this rank is done.
            if watch is not None:
                watch.own_done()
            elif self.rank != 0 and self.watching:
                sent = self.wcomm.isend(index, dest=0, tag=_DONE_TAG)
            if bar:
                bar.stop()
            self._agree(err)
        finally:
            if watch is not None:
                watch.finish()
            elif sent is not None:
                sent.wait()
        return {"op": op, "index": index, "checkpoint": ckpt, "rank": self.rank, "host": self.host,
                "t0_ns": t0, "t1_ns": t1, "wall_start": wall, "bytes": nbytes,
                "files": nfiles, "fsync": bool(op == "write" and opts.fsync),
                "direct": opts.direct, "dontcache": opts.dontcache}

    def _op_paths(self, rank: int, op: str, ckpt: int) -> list[str]:
        """The files ``rank`` writes (or reads) in op ``op`` of checkpoint ``ckpt``."""
        cdir = self.ckpt_root / f"ckpt-{ckpt:04d}"
        plan, ck = self.setup.plan, self.setup.config["checkpoint"]
        if op in ("write", "drain"):
            return [str(cdir / f.name) for f in plan.rank_plans[rank].files]
        return [str(cdir / rd.file.name) for rd in plan.restore_reads(rank, ck["restore"], self.shift)]

    def _stalled(self, op: str, index: int, ckpt: int, ranks: list[int], elapsed: float) -> None:
        """Rank 0's watch thread, at the deadline: one line naming the stalled ranks, this run's
        planned files removed (unless kept), then MPI_Abort so that every rank ends."""
        who = ", ".join(f"{r} on {self.rank_hosts[r]}" for r in ranks[:8]) + (" …" if len(ranks) > 8 else "")
        files = self._op_paths(ranks[0], op, ckpt)
        doing = "writing" if op == "write" else "reading"
        shown = ""
        if files:
            shown = f", {doing} {files[0]}" + (f" (+{len(files) - 1} more)" if len(files) > 1 else "")
        timeout = f"{self.timeout_s:g}"
        line = (f"rank{'s' if len(ranks) > 1 else ''} {who}: {op} {index} did not finish within "
                f"io.timeout_s={timeout} ({elapsed:.1f} s elapsed: a stalled rank or unresponsive "
                f"storage){shown}; aborting the MPI job")
        cfg = self.setup.config
        upto = ckpt if op == "write" else int(cfg["checkpoint"]["num_writes"])
        try:
            line += "; " + sweep_run(
                self.ckpt_root, [f.name for rp in self.setup.plan.rank_plans for f in rp.files], upto,
                keep=bool(cfg["checkpoint"]["keep"]),
                dirs=[d for d in self.created_dirs if not d.is_relative_to(self.ckpt_root)])
            fast = getattr(self, "fast_ckpt_root", None)
            if fast is not None:
                note = sweep_run(fast, [f.name for rp in self.setup.plan.rank_plans for f in rp.files], upto,
                                 keep=bool(cfg["checkpoint"]["keep"]))
                line += f" (fast tier: {note.removeprefix('removed ')})"
        except Exception as exc:  # never let cleanup stop the abort
            line += f"; cleanup failed: {exc}"
        stamp = datetime.now(timezone.utc).strftime("%H:%M:%S")
        self.log_lines.append(f"{stamp} error: {line}")
        try:
            print(f"mlckpt: error: {line}", file=sys.stderr, flush=True)
            # MPICH's proxies forward rank output asynchronously; an immediate Abort can tear them
            # down before the line reaches mpiexec (seen under load). Give the forwarding a moment.
            time.sleep(ABORT_GRACE_S)
        finally:
            if self.guardian is not None:
                self.guardian.end("reported")
            self.comm.Abort(1)
            os._exit(1)  # pragma: no cover - Abort does not return

    def _collect(self, rec: dict[str, Any], op: str, k: int, n: int, total: int, *,
                 keep: bool = True) -> list[dict[str, Any]]:
        recs = self.comm.gather(rec, root=0)
        if self.rank != 0:
            return []
        dur = max(r["t1_ns"] - r["t0_ns"] for r in recs) / 1e9
        moved = sum(r["bytes"] for r in recs)
        slow = min((r["bytes"] / ((r["t1_ns"] - r["t0_ns"]) / 1e9) for r in recs if r["bytes"]),
                   default=0.0)
        extra = ""
        if op == "read":
            cached = sum(r["resident_bytes"] for r in recs)
            tiers = {r.get("tier") for r in recs}
            where = "fast tier" if tiers == {FAST} else "fast and durable tiers" if FAST in tiers else ""
            if where and any(self.fast_fs.get(r["host"]) in MEMORY_FILESYSTEMS
                             for r in recs if r["tier"] == FAST):
                where += " in memory"
            extra = f", verified, {cached / max(moved, 1):.1%} cached before{', ' + where if where else ''}"
        self.say(f"{op} {k}/{n}: {fmt_bytes(moved)} in {dur:.2f} s = {moved / dur / GiB:.2f} GiB/s "
                 f"(slowest rank {slow / GiB:.2f} GiB/s{extra})")
        return list(recs) if keep else []

    # ------------------------------------------------------------------ cleanup and bundle
    def _cleanup(self) -> None:
        """Remove what this run created (checkpoint files, then its folders), unless kept.
        Only paths this run created are touched; a folder that is not empty is left alone."""
        keep = bool(getattr(self, "setup", None) and self.setup.config["checkpoint"]["keep"])
        if not keep:
            for path in self.created_files:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    print(f"mlckpt: warning: could not remove {path}: {exc}", file=sys.stderr)
        # From here on ranks may end normally: the guardian no longer blames the first to go.
        self._note(step="cleanup and result", final=True)
        try:
            self.comm.Barrier()
        except Exception:  # the world may be broken already; cleanup is best effort
            pass
        if not keep:
            for d in sorted(set(self.created_dirs), key=lambda p: len(p.parts), reverse=True):
                roots = [r for r in (getattr(self, "ckpt_root", None), getattr(self, "fast_ckpt_root", None))
                         if r is not None]
                try:
                    if d in roots:
                        (d / RUN_MARKER).unlink(missing_ok=True)
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    if any(d.is_relative_to(r) for r in roots):
                        print(f"mlckpt: warning: left {d} in place (not empty)", file=sys.stderr)

    def _write_bundle(self, records: list[dict[str, Any]], hosts: tuple[HostSpec, ...],
                      facts: list[dict[str, Any]], started: str) -> Path:
        s, cfg = self.setup, self.setup.config
        rules = s.rules
        summary = summarize(records, max_resident_fraction=rules.data["cold_read"]["max_resident_fraction"])
        if summary.get("num_reads") and not summary["read_cold"]:
            self.say(f"warning: [COLD-READ] {summary['read_resident_fraction_max']:.1%} of the restored "
                     "bytes were in the page cache before a restore (bound "
                     f"{rules.data['cold_read']['max_resident_fraction']:.0%}): read results are invalid")
        summary["read_valid"] = bool(summary.get("read_cold", True) and summary.get("read_verified", True))
        summary["checkpoint_bytes"] = s.plan.total_bytes
        summary["restore_bytes"] = s.plan.restore_bytes(cfg["checkpoint"]["restore"])
        summary["dlio_compat"] = dlio_compat(summary, s.plan.total_bytes)
        out_root = Path(cfg["output"]["root"]).absolute()
        final = out_root / self.run_name
        tmp = out_root / f".{self.run_name}.partial"
        tmp.mkdir(parents=True)
        ended = _now()
        system = {"hosts": facts}
        if self.description is not None:
            system["description"] = self.description
        manifest = {
            "run_format": RUN_FORMAT, "run_id": f"{self.run_id:016x}", "name": self.run_name,
            "status": "complete", "mlckpt_version": __version__, "rules_version": rules.version,
            "workload": cfg["workload"]["name"], "division": cfg["division"],
            "scaled": cfg["scale"] != 1.0, "scale": cfg["scale"], "ranks": self.size,
            "hosts": [{"host": h.name, "ranks": list(h.ranks)} for h in hosts],
            "rank_shift": self.shift, "verdict": self.verdict,
            "findings": [f.to_dict() for f in self.findings],
            "overrides": self.overrides, "started": started, "ended": ended,
            "records_format": RECORDS_FORMAT, "data_scheme": DATA_SCHEME,
            "system_name": (self.description or {}).get("system_name"),
            "pipeline": {"mode": self.pipe.mode, "compute_interval_s": self.pipe.compute_interval_s,
                         "fast": self.pipe.fast, "fast_keep": self.pipe.fast_keep,
                         "fast_fs": ({h.name: self.fast_fs.get(h.name) for h in hosts}
                                     if self.pipe.tiered else {})},
        }
        # Judge our own result with the checker's result-stage rules before publishing it.
        data = RunData(manifest, cfg, summary, records, system)
        ctx = replace(s.context(hosts, complete=True), run=data)
        result = rules.evaluate(ctx, ["result"])
        manifest["findings"] = [f.to_dict() for f in (*self.findings, *result.findings)]
        manifest["verdict"] = verdict([*self.findings, *result.findings], str(cfg["division"]))
        for f in result.findings:
            self.say(f"finding: [{f.rule}] ({f.severity}) {f.message}")
        _write_json(tmp / "run.json", manifest)
        (tmp / "config.yaml").write_text(yaml.safe_dump(dict(cfg), sort_keys=False))
        with open(tmp / "records.jsonl", "w") as fh:
            for r in records:
                fh.write(json.dumps(r, sort_keys=True) + "\n")
        _write_json(tmp / "summary.json", summary)
        _write_json(tmp / "system.json", system)
        self.say(_headline(summary) + f"; verdict {manifest['verdict']}")
        (tmp / "run.log").write_text("\n".join(self.log_lines) + "\n")
        try:
            if self.signing_key is not None:
                bundle.sign_bundle(tmp, self.signing_key, bundle.Predicate(
                    run_id=manifest["run_id"], mlckpt_version=__version__,
                    runner_code_sha256=bundle.code_digest(), rules_version=rules.version,
                    workload=str(cfg["workload"]["name"]), division=str(cfg["division"]),
                    started=started, ended=ended,
                    extra={"ranks": self.size, "scaled": manifest["scaled"],
                           "verdict": manifest["verdict"]}))
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # no half-made folder that could pass for a bundle
            raise
        if self.signing_key is None:
            print("mlckpt: warning: signing.key=none: the bundle is NOT signed and no checker "
                  "will accept it", file=sys.stderr)
        return final


# ---------------------------------------------------------------------- helpers
@dataclass
class _Writes:
    """What one rank's write phase works with."""

    root: Path  # this run's folder on the durable tier
    fast_root: Path | None  # ... and on the fast tier
    mine: Sequence[Any]  # this rank's planned files
    offsets: list[int]  # their places in the arena
    arena: Any  # the state (full residency) or the stream ring
    key: bytes
    opts: engine.IOOptions
    stream: bool
    leader: bool  # this host's first rank (makes folders)
    staging: Any = None  # async: the snapshot's host staging copy of the state
    ring: Any = None  # tiers: the drain's bounded buffer


_Job = tuple[Callable[[], Any], Callable[[], Any] | None]  # (persist, housekeeping after it)


class _Background:
    """One rank's background worker: runs one checkpoint's persist at a time (one staging slot).
    A persistent thread, so handing work over inside the stall costs a queue put, not a thread
    start.  Its failure is raised by ``wait`` in the training thread, which turns it into the
    usual collective error."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.finished = threading.Event()
        self.pending = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.late_error: BaseException | None = None  # from an ``after`` step
        self.thread = threading.Thread(target=self._loop, name="mlckpt-persist", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (item := self.jobs.get()) is not None:
            job, after = item
            try:
                self.result = job()
            except BaseException as exc:  # handed to the training thread
                self.error = exc
            self.finished.set()
            if after is not None and self.error is None:
                try:
                    after()
                except BaseException as exc:  # raised by the next wait
                    self.late_error = exc

    def submit(self, job: Callable[[], Any], after: Callable[[], Any] | None = None) -> None:
        """Run ``job``; once it is done (``wait`` returns its result), run ``after`` before the
        next job."""
        self.finished.clear()
        self.result, self.error, self.pending = None, None, True
        self.jobs.put((job, after))

    def done(self) -> bool:
        return self.finished.is_set()

    def wait(self) -> Any:
        self.finished.wait()
        self.pending = False
        error = self.error or self.late_error
        self.late_error = None
        if error is not None:
            raise error
        return self.result

    def close(self) -> None:
        """Let a running persist end (files must not be written after cleanup), then stop."""
        if self.pending:
            self.finished.wait()
        self.jobs.put(None)
        self.thread.join()


class _ProgressBar:
    """A bar on rank 0's terminal for ops longer than BAR_AFTER_S, driven by elapsed time against
    the previous op's duration (no counters inside the timed I/O path)."""

    def __init__(self, runner: Runner, op: str, index: int, nbytes: int) -> None:
        self.stop_event = threading.Event()
        self.shown = False
        self.thread: threading.Thread | None = None
        if not sys.stderr.isatty():
            return
        self.start = time.monotonic()
        self.label = f"{op} {index}"
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        spin = 0
        while not self.stop_event.wait(0.5):
            el = time.monotonic() - self.start
            if el < BAR_AFTER_S:
                continue
            spin = (spin + 1) % 20
            bar = "".join("#" if i == spin else "." for i in range(20))
            sys.stderr.write(f"\r  {self.label} [{bar}] {el:6.1f} s")
            sys.stderr.flush()
            self.shown = True

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread:
            self.thread.join()
            if self.shown:
                sys.stderr.write("\r" + " " * 50 + "\r")


class _OpWatch:
    """Rank 0's deadline for one timed op.  Every other rank sends a small "done" message (on the
    runner's duplicate communicator) after taking its t1; a thread on rank 0 collects them, polling
    every WATCH_POLL_S, and at io.timeout_s after rank 0 entered the op's barrier calls
    ``Runner._stalled`` with the ranks still missing.  A thread, so it works whatever rank 0's
    main thread is doing (its own I/O, waiting in a collective, or stalled itself)."""

    def __init__(self, runner: Runner, op: str, index: int, ckpt: int) -> None:
        self.runner, self.op, self.index, self.ckpt = runner, op, index, ckpt
        self.start = time.monotonic()
        self.pending = set(range(1, runner.size))
        self.own = False  # rank 0 finished its own part of the op
        self.finished = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="mlckpt-op-watch", daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        from mpi4py import MPI

        status = MPI.Status()
        comm = self.runner.wcomm
        while self.pending and comm.Iprobe(source=MPI.ANY_SOURCE, tag=_DONE_TAG, status=status):
            src = status.Get_source()
            comm.recv(source=src, tag=_DONE_TAG)
            self.pending.discard(src)

    def _loop(self) -> None:
        deadline = self.start + self.runner.timeout_s
        while not self.finished.is_set():
            self._drain()
            if self.own and not self.pending:
                return
            now = time.monotonic()
            if now >= deadline:
                late = sorted(self.pending | ({0} if not self.own else set()))
                self.runner._stalled(self.op, self.index, self.ckpt, late, now - self.start)
                return
            self.finished.wait(min(WATCH_POLL_S, deadline - now))

    def own_done(self) -> None:
        self.own = True

    def finish(self) -> None:
        """After the op's agreement (every rank has sent "done"): stop and collect the rest."""
        self.finished.set()
        self.thread.join()
        if self.own:
            for src in sorted(self.pending):
                self.runner.wcomm.recv(source=src, tag=_DONE_TAG)
            self.pending.clear()


def sweep_run(root: Path, names: Sequence[str], upto: int, *, keep: bool, dirs: Sequence[Path | str] = (),
              partial: str | None = None) -> str:
    """Remove what a run that cannot finish normally left: the planned checkpoint files
    ``root/ckpt-K/NAME`` (K = 1..upto, NAME one of ``names``; regular files only), the emptied
    checkpoint folders, the run marker and ``root`` once nothing else is in it, then ``dirs`` (the
    folders the run created above ``root``) when empty, and ``partial`` (the run's unfinished
    result folder).  Nothing else is touched.  Returns a short account for the user."""
    if partial:
        shutil.rmtree(partial, ignore_errors=True)
    if keep:
        return f"checkpoint.keep=true: checkpoint files kept in {root}"
    removed, left = 0, 0
    wanted = set(names)
    for k in range(1, upto + 1):
        cdir = root / f"ckpt-{k:04d}"
        for name in wanted:
            path = cdir / name
            try:
                if stat.S_ISREG(path.lstat().st_mode):
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                pass
            except OSError:
                left += 1
        try:
            cdir.rmdir()
        except OSError:
            pass
    try:
        if [e.name for e in os.scandir(root)] == [RUN_MARKER]:
            (root / RUN_MARKER).unlink()
        root.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        left += 1
    for d in sorted((Path(x) for x in dirs), key=lambda p: len(p.parts), reverse=True):
        try:
            d.rmdir()
        except OSError:
            pass
    note = f"removed {removed} checkpoint file{'s' if removed != 1 else ''} of this run"
    if left or root.exists():
        note += f"; some entries could not be removed, see {root}"
    return note


class Guardian:
    """Rank 0's helper process, so that a rank killed mid-run is still named and cleaned up after.

    When a rank dies (SIGKILL, the OOM killer, a crash), mpiexec kills every other rank at once,
    rank 0 included, so no rank can say what happened nor remove the run's files.  So rank 0
    forks, before MPI starts, a small process in its own session (mpiexec's cleanup signals the
    ranks' process groups, not it).  Rank 0 tells it over a pipe the ranks' pids and hosts, this
    run's planned paths and the step in progress.  When rank 0 ends without saying goodbye, the
    guardian waits for this host's ranks to be gone, prints one line naming the first local rank
    that died (pidfd order), its exit and the step it was in, removes this run's planned
    checkpoint files (``sweep_run``; unless checkpoint.keep) and exits.  Its stdout and stderr are
    rank 0's, so mpiexec forwards that line.  Ranks on other hosts are not watched: if none of
    this host's ranks died first, the line says so.
    """

    def __init__(self, wfd: int | None = None) -> None:
        self.wfd = wfd

    @classmethod
    def start(cls) -> Guardian | None:
        if _launcher_rank() != 0 or os.environ.get("MLCKPT_GUARDIAN") == "0" \
                or not hasattr(os, "pidfd_open"):
            return None
        rfd, wfd = os.pipe()
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError:
            os.close(rfd)
            os.close(wfd)
            return None
        if pid == 0:  # the guardian
            code = 0
            try:
                os.close(wfd)
                _guardian_main(rfd, parent)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(rfd)
        return cls(wfd)

    def send(self, **msg: Any) -> None:
        if self.wfd is None:
            return
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        try:
            while data:
                data = data[os.write(self.wfd, data):]
        except OSError:  # the guardian is gone: carry on without it
            self.close()

    def end(self, how: str) -> None:
        """Goodbye: ``clean`` (rank 0 finished and cleaned up) or ``reported`` (rank 0 reported the
        failure itself and is aborting the job)."""
        self.send(end=how)
        self.close()

    def close(self) -> None:
        if self.wfd is not None:
            fd, self.wfd = self.wfd, None
            try:
                os.close(fd)
            except OSError:
                pass


def _launcher_rank() -> int | None:
    """This process's rank as the MPI launcher announces it (before MPI starts), if it does."""
    for var in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return None


def _exit_how(pid: int) -> str:
    """How a process that just ended did so, read while it is a zombie (best effort)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
        code = int(raw[raw.rindex(")") + 2:].split()[-1])  # field 52, exit_code
    except (OSError, ValueError, IndexError):
        return ""
    if os.WIFSIGNALED(code):
        sig = os.WTERMSIG(code)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "?"
        return f"killed by signal {sig}, {name}"
    if os.WIFEXITED(code):
        return f"exited with status {os.WEXITSTATUS(code)}"
    return ""


def _realtime(on: bool) -> None:
    """Switch this process to the lowest real-time priority (SCHED_FIFO 1) or back; best effort:
    without the privilege it stays an ordinary process."""
    try:
        if on:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        else:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except (OSError, AttributeError):
        pass


def _guardian_main(rfd: int, parent: int) -> None:
    """The guardian's loop (see Guardian).  Who died first is told by the *life pipes*: each rank
    holds the write end of a pipe whose read end the guardian opens through /proc; it reports end
    of file the moment the rank's files are closed as it dies, before mpiexec can even notice and
    kill the others (pidfds only fire once a process is completely gone, which for a rank with a
    large address space can come after mpiexec has killed the rest).  The control pipe is rank
    0's life pipe."""
    os.setsid()
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    # Who died first is only known if the guardian runs the moment a life pipe closes, before
    # mpiexec's proxy (woken by the same death) kills the rest: on a busy host a normal-priority
    # guardian can wake too late and see two deaths at once.  A real-time priority (where allowed)
    # makes it preempt the ranks and the proxy; it only ever sleeps in poll, so it costs nothing.
    _realtime(True)
    os.closerange(3, rfd)
    os.closerange(rfd + 1, 1 << 16)
    poller = select.poll()
    poller.register(rfd, select.POLLIN)
    life: dict[int, int] = {}  # life-pipe fd -> rank
    pidfds: dict[int, tuple[int, int]] = {}  # pidfd -> (rank, pid)
    pids: dict[int, int] = {0: parent}
    how: dict[int, str] = {}
    first: list[int] = []  # the rank(s) whose end was seen first, while the run was going on
    state: dict[str, Any] = {"step": "start-up", "ckpt": 0, "cur": 0, "hosts": {0: socket.gethostname()}}

    def watch(rank: int, pid: int, life_fd: int | None) -> None:
        pids[rank] = pid
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:  # gone already
            ended([rank])
            return
        except OSError:  # no pidfds here (old kernel): the life pipe alone will do
            pass
        else:
            pidfds[fd] = (rank, pid)
            poller.register(fd, select.POLLIN)
        if life_fd is not None:
            try:
                lfd = os.open(f"/proc/{pid}/fd/{life_fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                return  # the pidfd alone will do (if there is one)
            life[lfd] = rank
            poller.register(lfd, select.POLLIN)

    def ended(ranks: list[int]) -> None:
        if ranks and not first and not state.get("final"):
            first.extend(sorted(ranks))

    def handle(msg: dict[str, Any]) -> None:
        if "ranks" in msg:
            for rank, pid, host, life_fd in msg["ranks"]:
                state["hosts"][rank] = host
                if host == msg["host"] and rank != 0:
                    watch(rank, pid, life_fd)
        if "step" in msg:
            state["step"] = msg["step"]
            state["cur"] = int(msg.get("ckpt", 0))
            if str(msg["step"]).startswith("write "):
                state["ckpt"] = max(state["ckpt"], state["cur"])
        for k in ("run", "names", "keep", "dirs", "partial", "end", "final", "fast_run", "fast_dirs"):
            if k in msg:
                state[k] = msg[k]

    def gone(fd: int) -> int | None:
        """A pidfd fired: that process is completely gone.  Returns its rank if it has no life pipe."""
        rank, pid = pidfds.pop(fd)
        poller.unregister(fd)
        how[rank] = _exit_how(pid)
        os.close(fd)
        return rank if rank not in life.values() else None  # rank 0: see the caller

    try:
        pfd = os.pidfd_open(parent)
        pidfds[pfd] = (0, parent)
        poller.register(pfd, select.POLLIN)
    except OSError:
        pass
    buf = b""
    rank0_gone = False
    while not rank0_gone:
        batch: list[int] = []
        for fd, _ev in poller.poll():
            if fd == rfd:
                data = os.read(rfd, 1 << 16)
                if data:
                    buf += data
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        handle(json.loads(line))
                else:
                    rank0_gone = True
                    poller.unregister(rfd)
                    batch.append(0)
            elif fd in life:
                batch.append(life.pop(fd))
                poller.unregister(fd)
                os.close(fd)
            elif fd in pidfds:
                rank = gone(fd)
                if rank == 0 and not rank0_gone:  # its control pipe is still open elsewhere
                    rank0_gone = True
                    batch.append(0)
                elif rank:
                    batch.append(rank)
        ended(sorted(set(batch)))
    _realtime(False)  # cleanup is ordinary work
    if state.get("end"):
        return
    # Rank 0 is gone without a goodbye.  Let this host's other ranks end too (mpiexec is killing
    # them) so that nothing writes while the run's files are removed.
    until = time.monotonic() + 5.0
    while pidfds and time.monotonic() < until:
        for fd, _ev in poller.poll(100):
            if fd in pidfds:
                gone(fd)
            elif fd in life:
                life.pop(fd)
                poller.unregister(fd)
                os.close(fd)
    culprits = first or [0]
    step = state["step"]
    hosts = state["hosts"]
    if len(culprits) == 1:
        rank = culprits[0]
        what = f"rank {rank} on {hosts.get(rank, '?')} (pid {pids.get(rank, '?')}) died during {step}"
        what += f" ({how[rank]})" if how.get(rank) else ""
    else:
        what = (f"ranks {', '.join(map(str, culprits))} on {hosts.get(culprits[0], '?')} died at the same "
                f"moment during {step}")
    op = step.split()[0] if step else ""
    if op in ("write", "read") and state.get("run") and state.get("cur"):
        cdir = Path(state["run"]) / f"ckpt-{state['cur']:04d}"
        names = state.get("names") or []
        rank = culprits[0]
        if op == "write" and rank < len(names) and names[rank]:
            more = len(names[rank]) - 1
            what += f", writing {cdir / names[rank][0]}" + (f" (+{more} more)" if more else "")
        else:
            what += f", reading from {cdir}"
    line = f"mlckpt: error: {what}; the MPI job was ended"
    if state.get("run"):
        try:
            line += "; " + sweep_run(
                Path(state["run"]), [n for ns in state.get("names", []) for n in ns],
                int(state["ckpt"]), keep=bool(state.get("keep")), dirs=state.get("dirs", []),
                partial=state.get("partial"))
            if state.get("fast_run"):
                note = sweep_run(Path(state["fast_run"]), [n for ns in state.get("names", []) for n in ns],
                                 int(state["ckpt"]), keep=bool(state.get("keep")),
                                 dirs=state.get("fast_dirs", []))
                line += f" (fast tier: {note.removeprefix('removed ')})"
        except Exception as exc:  # never let cleanup hide the report
            line += f"; cleanup failed: {exc}"
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def _offsets(sizes: Sequence[int]) -> list[int]:
    out = [0]
    for n in sizes:
        out.append(out[-1] + pages(n) * PAGE)
    return out


TEST_FAULT_ENV = "MLCKPT_TEST_FAULT"
TEST_FAULT_READY_ENV = "MLCKPT_TEST_FAULT_READY"
TEST_CORRUPT_ENV = "MLCKPT_TEST_CORRUPT"


def _test_fault(rank: int, op: str, index: int, action: Callable[[], Any]) -> Callable[[], Any]:
    """TEST-ONLY fault hook (never set it in a real run).  ``MLCKPT_TEST_FAULT=KIND:R:OP:K``
    (OP ``write`` or ``read``) acts on rank R inside its timed op OP K, after t0 and before its
    first byte.  KIND ``stall``: sleep forever (a stalled rank); ``kill``: SIGKILL itself (a killed
    rank); ``pause``: wait until the ready file below is removed, then do the op (so a test can
    change the world under a running op, e.g. fill the filesystem).  With
    ``MLCKPT_TEST_FAULT_READY=PATH`` the rank first writes its pid to PATH (``pause`` needs it),
    so a test knows the rank got there, or can kill it from outside.  Returns ``action`` itself
    when no fault applies."""
    spec = os.environ.get(TEST_FAULT_ENV)
    if not spec:
        return action
    kind, frank, fop, findex = spec.split(":")
    if (int(frank), fop, int(findex)) != (rank, op, index):
        return action

    def faulty() -> None:
        ready = os.environ.get(TEST_FAULT_READY_ENV)
        if ready:
            tmp = f"{ready}.tmp"
            with open(tmp, "w") as fh:
                fh.write(f"{os.getpid()}\n")
            os.replace(tmp, ready)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "pause" and ready:
            while os.path.exists(ready):
                time.sleep(0.01)
            return action()
        while True:  # stall
            time.sleep(3600)

    if kind not in ("stall", "kill", "pause"):
        raise InternalError(f"{TEST_FAULT_ENV}: unknown fault {kind!r}")
    return faulty


def _replace_with_copy(src: str, dst: str) -> None:
    """``dst`` becomes a copy of ``src`` (same directory temp file, then rename; fsynced)."""
    tmp = f"{dst}.mlckpt-test-tmp"
    shutil.copyfile(src, tmp)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, dst)


def _test_corrupt(rank: int, root: Path, plan: Any) -> None:
    """TEST-ONLY corruption hook (never set it in a real run), applied between the write and read
    phases like ``_test_flip``.  ``MLCKPT_TEST_CORRUPT`` is one of:

    * ``truncate:R:I:N``: rank R truncates its plan file I of checkpoint 1 to N bytes;
    * ``swap:R:S:I``: rank R swaps its plan file I of checkpoint 1 with rank S's file I;
    * ``stale:R:I``: rank R replaces its file I of checkpoint 2 with a copy of checkpoint 1's;
    * ``foreign:R:I:PATH``: rank R replaces its file I of checkpoint 1 with a copy of PATH (e.g. the
      same file kept from an earlier run).
    """
    spec = os.environ.get(TEST_CORRUPT_ENV)
    if not spec:
        return
    kind, _, rest = spec.partition(":")
    parts = rest.split(":", 3 if kind == "foreign" else -1)
    if int(parts[0]) != rank:
        return
    mine = plan.rank_plans[rank].files
    c1 = root / "ckpt-0001"
    touched: list[Path] = []
    if kind == "truncate":
        path = c1 / mine[int(parts[1])].name
        os.truncate(path, int(parts[2]))
        touched = [path]
    elif kind == "swap":
        index = int(parts[2])
        a, b = c1 / mine[index].name, c1 / plan.rank_plans[int(parts[1])].files[index].name
        tmp = c1 / f"{a.name}.mlckpt-test-tmp"
        os.rename(a, tmp)
        os.rename(b, a)
        os.rename(tmp, b)
        touched = [a, b]
    elif kind == "stale":
        name = mine[int(parts[1])].name
        _replace_with_copy(str(c1 / name), str(root / "ckpt-0002" / name))
        touched = [root / "ckpt-0002" / name]
    elif kind == "foreign":
        path = c1 / mine[int(parts[1])].name
        _replace_with_copy(parts[2], str(path))
        touched = [path]
    else:
        raise InternalError(f"{TEST_CORRUPT_ENV}: unknown corruption {kind!r}")
    for path in touched:
        engine.evict(str(path))


TEST_FLIP_ENV = "MLCKPT_TEST_FLIP"


def _test_flip(rank: int, cdir: Path, names: Sequence[str]) -> None:
    """TEST-ONLY fault hook (never set it in a real run): with ``MLCKPT_TEST_FLIP=R:I:OFF``, rank R
    flips one bit of byte OFF of its plan file I in the first checkpoint, between the write and read
    phases, so tests can check that verification reports the corruption and fails the run."""
    spec = os.environ.get(TEST_FLIP_ENV)
    if not spec:
        return
    flip_rank, index, offset = (int(x) for x in spec.split(":"))
    if flip_rank != rank:
        return
    _flip_bit(str(cdir / names[index]), offset)


TEST_FAST_FLIP_ENV = "MLCKPT_TEST_FAST_FLIP"


def _test_fast_flip(rank: int, when: str, k: int, fast_root: Path | None, names: Sequence[str]) -> None:
    """TEST-ONLY fault hook (never set it in a real run): ``MLCKPT_TEST_FAST_FLIP=WHEN:R:K:I:OFF``
    flips one bit of byte OFF of rank R's file I of checkpoint K on the fast tier, at WHEN:
    ``drain`` (after the fast copy is written, before it is drained to the durable tier) or
    ``restore`` (after the write phase, before the restores)."""
    spec = os.environ.get(TEST_FAST_FLIP_ENV)
    if not spec or fast_root is None:
        return
    fwhen, frank, fk, index, offset = spec.split(":")
    if (fwhen, int(frank), int(fk)) != (when, rank, k):
        return
    _flip_bit(str(fast_root / f"ckpt-{k:04d}" / names[int(index)]), int(offset))


def _flip_bit(path: str, offset: int) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        old = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([old[0] ^ 0x01]), offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    engine.evict(path)


def blocking_message(findings: Sequence[Any], division: str) -> str | None:
    """The one-line refusal for findings that forbid running: any ``invalid`` one, and in the
    closed division any ``open`` one (the run could never be a closed result)."""
    blocking = [f for f in findings
                if f.severity == "invalid" or (f.severity == "open" and division == "closed")]
    if not blocking:
        return None
    f = blocking[0]
    hint = " (closed division: fix it, or run with division=open)" if f.severity == "open" else ""
    more = f" [+{len(blocking) - 1} more]" if len(blocking) > 1 else ""
    return f"[{f.rule}] {f.message}{hint}{more}"


def local_host(folder: Path, ranks: Sequence[int], fast: str | None = None) -> HostSpec:
    """This host as the gates measure it (used by the self-launcher before spawning ranks)."""
    f = fast_tier_facts(fast, folder)
    return HostSpec(socket.gethostname(), tuple(ranks), mem_available_bytes(), disk_free_bytes(folder),
                    folder_problem(folder), f["fast_free_bytes"], f["fast_problem"], f["fast_fs"])


def fast_tier_facts(fast: str | None, durable: Path) -> dict[str, Any]:
    """What the gates need to know of this host's fast tier (nothing when there is none): free
    space, whether the folder is usable (a folder of its own: not inside the durable tier's, nor
    holding it, once links are resolved), its filesystem type, and whether it takes O_DIRECT."""
    out: dict[str, Any] = {"fast_free_bytes": None, "fast_problem": None, "fast_fs": None,
                           "fast_direct_ok": False}
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


def folder_problem(folder: Path) -> str | None:
    """Why ``folder`` can't hold checkpoints, or None.  It may be missing (created later) if its
    nearest existing ancestor is a writable directory; if present it must be a writable directory
    whose entries are all mlckpt run folders (carrying RUN_MARKER)."""
    if folder.is_symlink() and not folder.exists():
        return f"{folder} is a dangling link"
    if folder.exists():
        if not folder.is_dir():
            return f"{folder} is not a directory"
        if not os.access(folder, os.W_OK | os.X_OK):
            return f"{folder} is not writable"
        foreign = [e.name for e in os.scandir(folder)
                   if not (e.is_dir(follow_symlinks=False) and (Path(e.path) / RUN_MARKER).exists())]
        if foreign:
            shown = ", ".join(sorted(foreign)[:3]) + (" …" if len(foreign) > 3 else "")
            return f"{folder} holds files mlckpt did not write ({shown})"
        return None
    parent = existing_ancestor(folder)
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable (needed to create {folder})"
    return None


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


def resolve_signing_key(setting: str, say: Any) -> Any:
    """``auto``: the user's key (``mlckpt keygen``'s default path), created once; ``none``: no
    signature; anything else: a PEM key path (passphrase from $MLCKPT_KEY_PASSPHRASE)."""
    if setting == "none":
        return None
    if setting == "auto":
        path = bundle.default_key_path()
        if not path.exists():
            info = bundle.generate_key(path)
            say(f"created signing key {path} (keyid {info.keyid[:16]}…); give {info.public_path} "
                "to the committee that checks your results")
        return bundle.load_private_key(path)
    return bundle.load_private_key(Path(setting))


def _mpi_library() -> str:
    try:
        from mpi4py import MPI

        return MPI.Get_library_version().strip().splitlines()[0]
    except Exception:  # pragma: no cover - facts are best effort
        return ""


def _run_name(cfg: Any, run_id: int) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{cfg['workload']['name']}-{cfg['ranks']}r-{run_id:016x}"[:80]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _write_json(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")


def _headline(s: dict[str, Any]) -> str:
    parts = [f"write {s['write_bandwidth_mean_gib_s']:.2f} GiB/s mean "
             f"({s['write_duration_mean_s']:.2f} s per checkpoint)"]
    if s["write_overlap_efficiency"] is not None:  # something ran behind training
        parts.append(f"training stalled {s['write_stall_mean_s']:.3f} s per checkpoint, durable after "
                     f"{s['write_time_to_durable_mean_s']:.2f} s, "
                     f"overlap {s['write_overlap_efficiency']:.0%}")
    valid = "" if s.get("read_valid", True) else " INVALID"
    for name, label in (("read", "read"), ("read_fast", "read (fast tier)")):
        if f"{name}_bandwidth_mean_gib_s" in s:
            parts.append(f"{label} {s[f'{name}_bandwidth_mean_gib_s']:.2f} GiB/s mean "
                         f"({s[f'{name}_duration_mean_s']:.2f} s){valid}")
    return "result: " + "; ".join(parts)


def mpi_main(overrides: Sequence[str]) -> int:
    """Entry point on every rank under mpiexec."""
    guardian = Guardian.start()  # rank 0 only, and before MPI starts (no fork after MPI_Init)
    try:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        runner = Runner(comm, list(overrides), guardian=guardian)
        try:
            bundle = runner.run()
        except MlckptError as err:
            if runner.rank == 0:
                print(f"mlckpt: error: {err}", file=sys.stderr, flush=True)
            return err.exit_status
        if runner.rank == 0 and bundle is not None:
            print(f"bundle: {bundle}", flush=True)
        return 0
    finally:
        if guardian is not None:  # rank 0 got here: it reported and cleaned up itself
            guardian.end("clean")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(mpi_main(sys.argv[1:]))

