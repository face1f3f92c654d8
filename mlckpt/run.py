"""The MPI runner: gates, write phase, cache eviction, read phase, records.  Effects on MPI.

Every rank runs ``Runner.run``.  Each step that can fail locally ends in a collective
``_agree``: if any rank failed, every rank raises the same error (rank 0 prints it), so no rank
waits forever in a barrier.  Timing is per rank on its host's monotonic clock between leaving a
barrier and its last byte being durable (writes) or read (reads); metrics take the max over ranks.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from mlckpt import __version__, bundle, engine
from mlckpt.config import Setup, setup
from mlckpt.errors import InternalError, MlckptError, UsageError, VerificationError
from mlckpt.metrics import RECORDS_FORMAT, dlio_compat, summarize
from mlckpt.result_checks import DATA_SCHEME, RunData
from mlckpt.rules import HostSpec, rank_shift, verdict
from mlckpt.sizing import PAGE, pages
from mlckpt.sysdesc import load_system_description
from mlckpt.sysinfo import disk_free_bytes, existing_ancestor, host_facts, mem_available_bytes
from mlckpt.units import GiB, fmt_bytes

# Format history of run.json (the bundle manifest written by the runner):
#   1: first version: run identity, status, workload, division, scaled, verdict, findings,
#      overrides, host mapping, timings, file list.
RUN_FORMAT = 1
RUN_MARKER = ".mlckpt-run"  # marks a checkpoint run folder as ours (see folder gate)
BAR_AFTER_S = 3.0  # show a progress bar inside an op that takes longer than this


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
        more = f" (and {len(failures) - 1} more ranks)" if len(failures) > 1 else ""
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

    def __post_init__(self) -> None:
        self.rank: int = self.comm.Get_rank()
        self.size: int = self.comm.Get_size()
        self.host = socket.gethostname()
        self.log_lines: list[str] = []
        self.created_files: list[str] = []
        self.created_dirs: list[Path] = []

    # ------------------------------------------------------------------ collective helpers
    @contextmanager
    def step(self, what: str) -> Iterator[None]:
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

    # ------------------------------------------------------------------ the run
    def run(self) -> Path | None:
        started = _now()
        with self.step("configuration"):
            self.setup = self._configure()
        cfg = self.setup.config
        self.say(f"mlckpt {__version__}: {cfg['workload']['name']} on {self.size} ranks, division "
                 f"{cfg['division']}{', scaled × ' + str(cfg['scale']) if cfg['scale'] != 1 else ''}, "
                 f"{fmt_bytes(self.setup.plan.total_bytes)} per checkpoint, "
                 f"{cfg['checkpoint']['num_writes']} writes, {cfg['checkpoint']['num_reads']} reads")
        hosts, facts = self._gates()
        with self.step("signing key"):
            # After the gates (a refused run writes nothing, not even a new key), before any I/O.
            if self.rank == 0:
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
                     by_host[h]["folder_problem"])
            for h in order)
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
        leader = next(h for h in hosts if self.rank in h.ranks).ranks[0] == self.rank
        with self.step("checkpoint folder"):
            if leader:
                # Folders this run creates (the configured folder too, if missing) are removed at
                # the end when empty; pre-existing ones are never touched.
                missing = [p for p in (root.parent, *root.parent.parents) if not p.exists()]
                self.created_dirs.extend(missing)
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
        records: list[dict[str, Any]] = []
        nw, nr = int(ck["num_writes"]), int(ck["num_reads"])
        dir_fsync = opts.fsync
        for k in range(1, nw + 1):
            cdir = root / f"ckpt-{k:04d}"
            with self.step(f"prepare checkpoint {k}"):
                if not stream:
                    for i, f in enumerate(mine):
                        view = arena[own_offsets[i]:own_offsets[i + 1]]
                        engine.fill(view, f.bytes, key, engine.PageId(self.run_id, self.rank, k, i))
                if leader:
                    cdir.mkdir(exist_ok=True)
                    self.created_dirs.append(cdir)
            paths = [str(cdir / f.name) for f in mine]
            self.created_files += paths
            if stream:
                sfiles = [engine.StreamFile(p, f.bytes, engine.PageId(self.run_id, self.rank, k, i))
                          for i, (p, f) in enumerate(zip(paths, mine, strict=True))]
                action = partial(engine.write_stream, sfiles, key, opts, arena,
                                 dir_fsync=[str(cdir)] if dir_fsync else ())
            else:
                files = [engine.FileIO(p, arena[own_offsets[i]:own_offsets[i + 1]], f.bytes)
                         for i, (p, f) in enumerate(zip(paths, mine, strict=True))]
                action = partial(engine.write_files, files, opts,
                                 dir_fsync=[str(cdir)] if dir_fsync else ())
            rec = self._timed("write", k, k, action, sum(f.bytes for f in mine), len(mine), opts)
            records += self._collect(rec, "write", k, nw, plan.total_bytes)
        with self.step("cache eviction after writes"):
            for path in self.created_files:
                engine.evict(path)
            if cfg["cache"]["drop_system"] and leader:
                engine.drop_caches()
            _test_flip(self.rank, root / "ckpt-0001", [f.name for f in mine])
        scratch = engine.alloc(engine.VERIFY_SCRATCH_BYTES)
        for k in range(1, nr + 1):
            c = (k - 1) % nw + 1
            cdir = root / f"ckpt-{c:04d}"
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
                rec = self._timed("read", k, c, partial(engine.read_stream, sfiles, key, opts, arena),
                                  nbytes, len(reads), opts)
                rec.update(resident_bytes=resident, cached_check_bytes=nbytes, verified_bytes=nbytes,
                           mismatches=0)
                records += self._collect(rec, "read", k, nr, plan.restore_bytes(ck["restore"]))
                continue
            files = [engine.FileIO(p, arena[read_offsets[i]:read_offsets[i + 1]], rd.file.bytes)
                     for i, (p, rd) in enumerate(zip(paths, reads, strict=True))]
            rec = self._timed("read", k, c, partial(engine.read_files, files, opts), nbytes, len(reads), opts)
            rec["resident_bytes"] = resident
            rec["cached_check_bytes"] = nbytes
            with self.step(f"verify restore {k}"):
                rec["verified_bytes"] = 0
                rec["mismatches"] = 0
                for fio, rd in zip(files, reads, strict=True):
                    pid = engine.PageId(self.run_id, rd.writer, c, rd.index)
                    bad = engine.verify(fio.buf, fio.nbytes, key, pid, scratch)
                    if bad is not None:
                        rec["mismatches"] += 1
                        raise VerificationError(
                            f"verification failed reading {fio.path}: {bad.describe()}",
                            rank=self.rank, file=fio.path, offset=bad.offset)
                    rec["verified_bytes"] += fio.nbytes
            records += self._collect(rec, "read", k, nr, plan.restore_bytes(ck["restore"]))
        del arena
        return records

    def _timed(self, op: str, index: int, ckpt: int, action: Callable[[], Any], nbytes: int,
               nfiles: int, opts: engine.IOOptions) -> dict[str, Any]:
        """One timed op on this rank (``action``), after a barrier; every rank agrees on failure."""
        self.comm.Barrier()
        wall = time.time()
        bar = _ProgressBar(self, op, index, nbytes) if self.rank == 0 else None
        t0 = time.perf_counter_ns()
        err: BaseException | None = None
        try:
            action()
        except engine.StreamMismatch as exc:
            err = VerificationError(f"verification failed reading {exc.path}: {exc.mismatch.describe()}",
                                    rank=self.rank, file=exc.path, offset=exc.mismatch.offset)
        except MlckptError as exc:
            err = exc
        except Exception as exc:
            err = InternalError(f"{op} {index}: {type(exc).__name__}: {exc}")
        t1 = time.perf_counter_ns()
        if bar:
            bar.stop()
        self._agree(err)
        return {"op": op, "index": index, "checkpoint": ckpt, "rank": self.rank, "host": self.host,
                "t0_ns": t0, "t1_ns": t1, "wall_start": wall, "bytes": nbytes,
                "files": nfiles, "fsync": bool(op == "write" and opts.fsync),
                "direct": opts.direct, "dontcache": opts.dontcache}

    def _collect(self, rec: dict[str, Any], op: str, k: int, n: int, total: int) -> list[dict[str, Any]]:
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
            extra = f", verified, {cached / max(moved, 1):.1%} cached before"
        self.say(f"{op} {k}/{n}: {fmt_bytes(moved)} in {dur:.2f} s = {moved / dur / GiB:.2f} GiB/s "
                 f"(slowest rank {slow / GiB:.2f} GiB/s{extra})")
        return list(recs)

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
        try:
            self.comm.Barrier()
        except Exception:  # the world may be broken already; cleanup is best effort
            pass
        if not keep:
            for d in sorted(set(self.created_dirs), key=lambda p: len(p.parts), reverse=True):
                try:
                    if d == getattr(self, "ckpt_root", None):
                        (d / RUN_MARKER).unlink(missing_ok=True)
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    if d.is_relative_to(getattr(self, "ckpt_root", d)):
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


def _offsets(sizes: Sequence[int]) -> list[int]:
    out = [0]
    for n in sizes:
        out.append(out[-1] + pages(n) * PAGE)
    return out


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
    path = str(cdir / names[index])
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


def local_host(folder: Path, ranks: Sequence[int]) -> HostSpec:
    """This host as the gates measure it (used by the self-launcher before spawning ranks)."""
    return HostSpec(socket.gethostname(), tuple(ranks), mem_available_bytes(), disk_free_bytes(folder),
                    folder_problem(folder))


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


def resolve_signing_key(setting: str, say: Any) -> Any:
    """``auto``: the user's key (``mlckpt keygen``'s default path), created once; ``none``: no
    signature; anything else: a PEM key path (passphrase from $MLCKPT_KEY_PASSPHRASE)."""
    from mlckpt.cli.bundle_cmd import default_key_path

    if setting == "none":
        return None
    if setting == "auto":
        path = default_key_path()
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
    if s.get("num_reads"):
        parts.append(f"read {s['read_bandwidth_mean_gib_s']:.2f} GiB/s mean "
                     f"({s['read_duration_mean_s']:.2f} s){'' if s['read_valid'] else ' INVALID'}")
    return "result: " + "; ".join(parts)


def mpi_main(overrides: Sequence[str]) -> int:
    """Entry point on every rank under mpiexec."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    runner = Runner(comm, list(overrides))
    try:
        bundle = runner.run()
    except MlckptError as err:
        if runner.rank == 0:
            print(f"mlckpt: error: {err}", file=sys.stderr, flush=True)
        return err.exit_status
    if runner.rank == 0 and bundle is not None:
        print(f"bundle: {bundle}", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(mpi_main(sys.argv[1:]))

