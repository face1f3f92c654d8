"""``mlckpt witness serve``: the witness as an aiohttp service.

Every answer that acknowledges an event comes after its journal line is on disk; every time in a
receipt is the witness's own (wall clock and monotonic clock, read when the request arrived).
Runs are independent: each has its own lock, so many runs are witnessed at once.

Strangers cannot exhaust it: only a request signed by a trusted key opens a run (refused before
anything is stored otherwise), each key's share is bounded (mlckpt/witness/admission.py), a run
that goes quiet expires, closed runs leave memory for a gzip'ed archive kept for a declared time,
a journal short of space refuses new runs, and every connection must deliver its request within
``header_timeout_s`` and is closed after ``connection_life_s`` (a slow client cannot hold one).
"""

from __future__ import annotations

import asyncio
import resource
import secrets
import signal
import ssl
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mlckpt import bundle, dsse
from mlckpt import strict as loading
from mlckpt.errors import EnvelopeError
from mlckpt.witness import protocol
from mlckpt.witness.admission import Challenges, Ledger, Limits
from mlckpt.witness.connections import Connections, Guarded
from mlckpt.witness.journal import Journal, JournalFull
from mlckpt.witness.lag import LagMeter

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PING_TTL_S = 60.0  # a ping not answered within this is forgotten
MAX_PINGS_PER_RUN = 16  # outstanding pings one run may hold
BODY_TIMEOUT_S = 10.0  # a request's body must arrive within this


@dataclass(frozen=True)
class Options:
    """How a witness serves: everything ``mlckpt witness serve`` takes."""
    listen: str
    key: Path
    journal: Path
    trusted_keys: Path
    limits: Limits = field(default_factory=Limits)
    keep_s: float | None = 90 * 86400.0  # archived runs kept this long (None: forever)
    keep_runs: int | None = None  # at most this many archived runs (None: no count bound)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    max_connections: int = 512
    header_timeout_s: float = 10.0
    connection_life_s: float = 60.0


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure as one JSON line naming what is wrong; the journal is never touched by one."""
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        return _error(413, f"request larger than {protocol.MAX_REQUEST_BYTES} bytes")
    except web.HTTPException as exc:
        return _error(exc.status, exc.reason)
    except JournalFull as exc:
        return _error(507, str(exc.strerror))


class Witness:
    def __init__(self, journal: Journal, key: Ed25519PrivateKey, trusted: bundle.TrustedKeys,
                 limits: Limits | None = None) -> None:
        self.journal = journal
        self.key = key
        self.keyid = bundle.keyid_of_key(key)  # the id trusted-witness files will name
        self.trusted = trusted
        self.ledger = Ledger(limits or Limits())
        self.challenges = Challenges(secrets.token_bytes(32))
        self.runs = journal.load()  # open runs only; closed ones are archived on disk
        now = time.monotonic_ns()
        for run, entries in self.runs.items():
            opener = str(entries[0].get("opened_by", "format-1"))
            self.ledger.opened(opener, run, now, sum(len(str(e)) for e in entries))
        self.locks: dict[str, asyncio.Lock] = {}
        self.pings: dict[tuple[str, str], int] = {}
        # (run, op, index) -> ns from an op's start arriving to its answer being ready (not kept
        # across a restart: an end after one carries none, and the checker uses the arrival)
        self.served: dict[tuple[str, str, int], int] = {}
        self.refused = 0  # requests refused before anything was stored (shown at the end)
        self.lag = LagMeter()  # ticks while the app runs (witness format 2: each event's lag_ns)

    def sign(self, doc: dict[str, object], payload_type: str) -> dict[str, object]:
        return bundle.make_envelope(doc, self.key, payload_type)

    async def body(self, request: web.Request, kind: str) -> dict[str, Any]:
        raw = await self.raw(request)
        try:
            doc = loading.parse_json(raw or b"{}")
        except loading.ParseError as exc:
            raise web.HTTPBadRequest(reason=f"not JSON: {exc}") from None
        problem = protocol.request_problem(kind, doc)
        if problem:
            raise web.HTTPBadRequest(reason=problem)
        return dict(doc)

    @staticmethod
    async def raw(request: web.Request) -> bytes:
        try:
            return await asyncio.wait_for(request.read(), BODY_TIMEOUT_S)
        except TimeoutError:
            raise web.HTTPRequestTimeout(reason=f"the request's body took over {BODY_TIMEOUT_S:g} s") \
                from None

    async def record(self, run: str, fields: dict[str, Any], t_wall: int, t_mono: int, *,
                     bounded: bool = True) -> dict[str, object]:
        """Journal one event (stamped with the witness's clocks) and sign its receipt; within its
        opener's byte bound unless ``bounded`` is False (the witness's own expire entry)."""
        entries = self.runs[run]
        entry = {"seq": len(entries) + 1, "t_wall_ns": t_wall, "t_mono_ns": t_mono, **fields}
        room = self.ledger.room(run, len(str(entry)) + 128) if bounded else None
        if room:
            raise web.HTTPTooManyRequests(reason=room)
        full, nbytes = await asyncio.to_thread(self.journal.append, run, entry)
        entries.append(full)
        self.ledger.wrote(run, nbytes, time.monotonic_ns())
        return {"run": run, "seq": full["seq"], "receipt": self.sign(protocol.receipt(run, {
            k: v for k, v in full.items() if k != "config"}), protocol.RECEIPT_TYPE)}

    def lock(self, run: str) -> asyncio.Lock:
        return self.locks.setdefault(run, asyncio.Lock())

    def known(self, request: web.Request) -> str:
        """The open run a request names; 409 for one that ended, 404 for one never opened here."""
        run = request.match_info["run"]
        if run in self.runs:
            return run
        ended = self.ended_entries(run)
        if ended is not None:
            raise web.HTTPConflict(reason=protocol.ended_problem(ended))
        raise web.HTTPNotFound(reason=f"no witnessed run {run}")

    def ended_entries(self, run: str) -> list[dict[str, object]] | None:
        try:
            return self.journal.archived(run)
        except ValueError:  # not a run id at all
            return None

    def refuse(self, status: type[web.HTTPException], reason: str) -> web.HTTPException:
        self.refused += 1
        return status(reason=reason)

    async def end(self, run: str) -> None:
        """A closed or expired run leaves memory for its archive."""
        await asyncio.to_thread(self.journal.archive, run)
        self.ledger.ended(run)
        del self.runs[run]
        self.locks.pop(run, None)
        self.served = {k: v for k, v in self.served.items() if k[0] != run}
        self.pings = {k: v for k, v in self.pings.items() if k[0] != run}

    # --- handlers -------------------------------------------------------------------------------

    async def info(self, request: web.Request) -> web.Response:
        return web.json_response({"witness_format": protocol.WITNESS_FORMAT, "keyid": self.keyid,
                                  "public_key": bundle.public_key_text(self.key)})

    async def challenge(self, request: web.Request) -> web.Response:
        return web.json_response({"challenge": self.challenges.issue(time.time_ns())})

    async def open(self, request: web.Request) -> web.Response:
        t_wall, t_mono = time.time_ns(), time.monotonic_ns()
        raw = await self.raw(request)
        try:
            doc, signer, _ = dsse.open_signed(raw, protocol.OPEN_TYPE)
        except EnvelopeError as exc:
            raise self.refuse(web.HTTPUnauthorized, "an open must be signed by a trusted key (mlckpt run "
                                                    f"signs it with signing.key): {exc}") from None
        org = self.trusted.org_for(signer)
        if org is None:
            raise self.refuse(web.HTTPForbidden, f"the key with fingerprint {signer[:16]} is not in this "
                                                 "witness's trusted keys")
        problem = protocol.request_problem("open", doc)
        if problem:
            raise self.refuse(web.HTTPBadRequest, problem)
        if doc["witness_keyid"] != self.keyid:
            raise self.refuse(web.HTTPUnauthorized, "the open was signed for another witness")
        stale = self.challenges.redeem(str(doc["challenge"]), time.time_ns())
        if stale:
            raise self.refuse(web.HTTPUnauthorized, stale)
        refusal = self.ledger.admit(signer, t_mono, await asyncio.to_thread(self.journal.free_bytes))
        if refusal:
            raise self.refuse(web.HTTPServiceUnavailable if refusal.witness_wide else web.HTTPTooManyRequests,
                              refusal.reason)
        run = secrets.token_hex(8)
        fields = {k: v for k, v in doc.items() if k in ("plan_digest", "config", "client")}
        self.runs[run] = []
        self.ledger.opened(signer, run, t_mono, 0)
        try:
            async with self.lock(run):
                out = await self.record(run, {"kind": "open", **fields, "opened_by": signer, "org": org},
                                        t_wall, t_mono)
        except BaseException:
            self.ledger.ended(run)
            del self.runs[run]
            self.locks.pop(run, None)
            self.journal.path(run).unlink(missing_ok=True)  # never acknowledged
            raise
        return web.json_response(out)

    async def event(self, request: web.Request) -> web.Response:
        t_wall, t_mono = time.time_ns(), time.monotonic_ns()
        run = self.known(request)
        body = await self.body(request, "event")
        async with self.lock(run):
            run = self.known(request)  # it may have expired while the lock was held
            problem = protocol.order_problem(self.runs[run], body)
            if problem:
                raise web.HTTPConflict(reason=problem)
            fields: dict[str, object] = {**body}
            if body["kind"] == "start" and body["op"] == "write":
                fields["nonce"] = secrets.token_hex(16)  # bound into this checkpoint's content
            op = (run, body["op"], body["index"])
            # How late this request's stamp may be: the witness's own loop was busy or off the CPU.
            fields["lag_ns"] = self.lag.lag_ns(t_mono)
            if body["kind"] == "end" and op in self.served:
                # How long the start took the witness to answer (its journal's fsync, the
                # signature): the op could not begin before that answer reached the runner.
                fields["start_service_ns"] = self.served.pop(op)
            out = await self.record(run, fields, t_wall, t_mono)
            if body["kind"] == "start":
                self.served[op] = time.monotonic_ns() - t_mono
        if "nonce" in fields:
            out["nonce"] = fields["nonce"]
        return web.json_response(out)

    async def ping(self, request: web.Request) -> web.Response:
        run = self.known(request)
        token = secrets.token_hex(16)
        now = time.monotonic_ns()
        self.pings = {k: t for k, t in self.pings.items() if now - t < PING_TTL_S * 1e9}
        if sum(1 for r, _ in self.pings if r == run) >= MAX_PINGS_PER_RUN:
            raise web.HTTPTooManyRequests(reason=f"more than {MAX_PINGS_PER_RUN} pings unanswered")
        self.pings[(run, token)] = time.monotonic_ns()
        return web.json_response({"token": token})

    async def pong(self, request: web.Request) -> web.Response:
        t_wall, t_mono = time.time_ns(), time.monotonic_ns()
        run = self.known(request)
        body = await self.body(request, "pong")
        sent = self.pings.pop((run, body["token"]), None)
        if sent is None:
            raise web.HTTPConflict(reason="unknown or expired ping token")
        async with self.lock(run):
            run = self.known(request)
            problem = protocol.order_problem(self.runs[run], {"kind": "rtt"})
            if problem:
                raise web.HTTPConflict(reason=problem)
            out = await self.record(run, {"kind": "rtt", "rtt_ns": t_mono - sent}, t_wall, t_mono)
        return web.json_response(out)

    async def close(self, request: web.Request) -> web.Response:
        t_wall, t_mono = time.time_ns(), time.monotonic_ns()
        run = self.known(request)
        await self.body(request, "close")
        async with self.lock(run):
            run = self.known(request)
            problem = protocol.order_problem(self.runs[run], {"kind": "close"})
            if problem:
                raise web.HTTPConflict(reason=problem)
            out = await self.record(run, {"kind": "close"}, t_wall, t_mono)
            out["transcript"] = self.transcript(run, self.runs[run])
            await self.end(run)
        return web.json_response(out)

    async def get_transcript(self, request: web.Request) -> web.Response:
        run = request.match_info["run"]
        if run in self.runs:
            raise web.HTTPConflict(reason="the run is not closed")
        entries = self.ended_entries(run)
        if entries is None:
            raise web.HTTPNotFound(reason=f"no witnessed run {run} (never opened here, or past retention)")
        if entries[-1]["kind"] != "close":
            raise web.HTTPConflict(reason=protocol.ended_problem(entries))
        return web.json_response(self.transcript(run, entries))

    def transcript(self, run: str, entries: list[dict[str, object]]) -> dict[str, object]:
        return self.sign(protocol.transcript(run, entries, self.keyid), protocol.TRANSCRIPT_TYPE)

    async def expire(self) -> int:
        """End each run idle past the bound (an ``expire`` entry, archived, its share freed): how many."""
        done = 0
        for run, idle in self.ledger.idle(time.monotonic_ns()):
            async with self.lock(run):
                if run not in self.runs:
                    continue
                await self.record(run, {"kind": "expire", "idle_s": round(idle, 3)}, time.time_ns(),
                                  time.monotonic_ns(), bounded=False)
                await self.end(run)
                done += 1
        return done

    async def ticking(self, app: web.Application) -> AsyncIterator[None]:
        """The lag meter's tick, for as long as the app runs."""
        tick = asyncio.create_task(self.lag.run())
        yield
        tick.cancel()

    def app(self) -> web.Application:
        protocol.compile_requests()
        app = web.Application(middlewares=[errors], client_max_size=protocol.MAX_REQUEST_BYTES)
        app.cleanup_ctx.append(self.ticking)
        app.add_routes([
            web.get("/v1/witness", self.info),
            web.get("/v1/challenge", self.challenge),
            web.post("/v1/runs", self.open),
            web.post("/v1/runs/{run}/events", self.event),
            web.post("/v1/runs/{run}/pings", self.ping),
            web.post("/v1/runs/{run}/pongs", self.pong),
            web.post("/v1/runs/{run}/close", self.close),
            web.get("/v1/runs/{run}/transcript", self.get_transcript),
        ])
        return app


def tls_context(opts: Options) -> ssl.SSLContext | None:
    if opts.tls_cert is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(opts.tls_cert), str(opts.tls_key) if opts.tls_key else None)
    return ctx


async def _housekeeping(witness: Witness, opts: Options) -> None:
    """Expire quiet runs and prune old archives, at a pace set by the expiry bound."""
    pause = min(60.0, max(0.05, opts.limits.expire_after_s / 4))
    while True:
        await asyncio.sleep(pause)
        try:
            await witness.expire()
            if opts.keep_s is not None or opts.keep_runs is not None:
                await asyncio.to_thread(witness.journal.prune, opts.keep_s, opts.keep_runs)
        except (OSError, web.HTTPException) as exc:  # a full disk: try again at the next round
            print(f"mlckpt witness: housekeeping deferred: {exc}", file=sys.stderr, flush=True)


async def _serve(host: str, port: int, witness: Witness, opts: Options) -> None:
    runner = web.AppRunner(witness.app(), access_log=None, keepalive_timeout=5.0)
    await runner.setup()
    ctx = tls_context(opts)
    loop = asyncio.get_running_loop()
    assert runner.server is not None
    factory, count = runner.server, Connections()
    def guarded() -> Guarded:
        return Guarded(factory(), count, max_connections=opts.max_connections,
                       header_timeout_s=opts.header_timeout_s, life_s=opts.connection_life_s)

    server = await loop.create_server(guarded, host, port, ssl=ctx, reuse_address=True)
    bound = server.sockets[0].getsockname() if server.sockets else (host, port)
    scheme = "https" if ctx else "http"
    print(f"mlckpt witness: listening on {scheme}://{bound[0]}:{bound[1]} (key fingerprint "
          f"{witness.keyid[:16]}, journal {witness.journal.folder}, {len(witness.runs)} runs open, "
          f"{len(witness.trusted.organisations)} organisations may open runs)", flush=True)
    # What a committee pastes under ``witnesses:`` in trusted-witnesses.yaml (docs: Witnessed runs).
    print(f'trusted-witnesses entry: NAME: ["{bundle.public_key_text(witness.key)}"]', flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    chores = asyncio.create_task(_housekeeping(witness, opts))
    await stop.wait()
    chores.cancel()
    server.close()
    await runner.cleanup()


def _raise_fd_limit(need: int) -> None:
    """Room for ``need`` connections besides the journal's files (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = need + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY
                                                    else min(want, hard), hard))


def serve(opts: Options) -> int:
    """Run the witness until SIGINT or SIGTERM."""
    from mlckpt.errors import UsageError

    host, _, port = opts.listen.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--listen: expected HOST:PORT, got {opts.listen!r}", key="--listen")
    problem = opts.limits.problem()
    if problem:
        raise UsageError(problem, key=problem.split(":")[0])
    if (opts.tls_cert is None) != (opts.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together", key="--tls-cert")
    trusted = bundle.TrustedKeys.load(opts.trusted_keys)
    try:
        tls_context(opts)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"--tls-cert/--tls-key: cannot load them: {exc}", key="--tls-cert") from None
    witness = Witness(Journal(opts.journal), bundle.load_private_key(opts.key), trusted, opts.limits)
    _raise_fd_limit(opts.max_connections)
    try:
        asyncio.run(_serve(host.strip("[]"), int(port), witness, opts))
    except OSError as exc:
        raise UsageError(f"--listen {opts.listen}: {exc.strerror or exc}", key="--listen") from None
    print(f"mlckpt witness: stopped ({witness.refused} requests refused before anything was stored; "
          f"its loop ran at worst {witness.lag.worst_ns / 1e6:.1f} ms late)",
          file=sys.stderr, flush=True)
    return 0
