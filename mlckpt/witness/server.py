"""``mlckpt witness serve``: the witness as an aiohttp service.

Every answer that acknowledges an event comes after its journal line is on disk; every time in a
receipt is the witness's own (wall clock and monotonic clock, read when the request arrived).
Runs are independent: each has its own lock, so many runs are witnessed at once.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from mlckpt import bundle
from mlckpt import strict as loading
from mlckpt.witness import protocol
from mlckpt.witness.journal import Journal

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PING_TTL_S = 60.0  # a ping not answered within this is forgotten


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


class Witness:
    def __init__(self, journal: Journal, key: Any) -> None:
        self.journal = journal
        self.key = key
        self.keyid = bundle.keyid_of_key(key)  # the id trusted-witness files will name
        self.runs = journal.load()
        self.locks: dict[str, asyncio.Lock] = {}
        self.pings: dict[tuple[str, str], int] = {}
        # (run, op, index) -> ns from an op's start arriving to its answer being ready (not kept
        # across a restart: an end after one carries none, and the checker uses the arrival)
        self.served: dict[tuple[str, str, int], int] = {}

    def sign(self, doc: dict[str, Any], payload_type: str) -> dict[str, Any]:
        return bundle.make_envelope(doc, self.key, payload_type)

    async def body(self, request: web.Request, kind: str) -> dict[str, Any]:
        raw = await request.read()
        try:
            doc = loading.parse_json(raw or b"{}")
        except loading.ParseError as exc:
            raise web.HTTPBadRequest(reason=f"not JSON: {exc}") from None
        problem = protocol.request_problem(kind, doc)
        if problem:
            raise web.HTTPBadRequest(reason=problem)
        return dict(doc)

    async def record(self, run: str, fields: dict[str, Any], t_wall: int, t_mono: int) -> dict[str, Any]:
        """Journal one event (stamped with the witness's clocks) and sign its receipt."""
        entries = self.runs.setdefault(run, [])
        entry = {"seq": len(entries) + 1, "t_wall_ns": t_wall, "t_mono_ns": t_mono, **fields}
        full = await asyncio.to_thread(self.journal.append, run, entry)
        entries.append(full)
        return {"run": run, "seq": full["seq"], "receipt": self.sign(protocol.receipt(run, {
            k: v for k, v in full.items() if k != "config"}), protocol.RECEIPT_TYPE)}

    def lock(self, run: str) -> asyncio.Lock:
        return self.locks.setdefault(run, asyncio.Lock())

    def known(self, request: web.Request) -> str:
        run = request.match_info["run"]
        if run not in self.runs:
            raise web.HTTPNotFound(reason=f"no witnessed run {run}")
        return run

    # --- handlers -------------------------------------------------------------------------------

    async def info(self, request: web.Request) -> web.Response:
        return web.json_response({"witness_format": protocol.WITNESS_FORMAT, "keyid": self.keyid,
                                  "public_key": bundle.public_key_text(self.key)})

    async def open(self, request: web.Request) -> web.Response:
        t_wall, t_mono = time.time_ns(), time.monotonic_ns()
        body = await self.body(request, "open")
        run = secrets.token_hex(8)
        async with self.lock(run):
            out = await self.record(run, {"kind": "open", **body}, t_wall, t_mono)
        return web.json_response(out)

    async def event(self, request: web.Request) -> web.Response:
        t_wall, t_mono = time.time_ns(), time.monotonic_ns()
        run = self.known(request)
        body = await self.body(request, "event")
        async with self.lock(run):
            problem = protocol.order_problem(self.runs[run], body)
            if problem:
                raise web.HTTPConflict(reason=problem)
            fields: dict[str, Any] = {**body}
            if body["kind"] == "start" and body["op"] == "write":
                fields["nonce"] = secrets.token_hex(16)  # bound into this checkpoint's content
            op = (run, body["op"], body["index"])
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
            problem = protocol.order_problem(self.runs[run], {"kind": "close"})
            if problem:
                raise web.HTTPConflict(reason=problem)
            out = await self.record(run, {"kind": "close"}, t_wall, t_mono)
        out["transcript"] = self.transcript(run)
        return web.json_response(out)

    async def get_transcript(self, request: web.Request) -> web.Response:
        run = self.known(request)
        if self.runs[run][-1]["kind"] != "close":
            raise web.HTTPConflict(reason="the run is not closed")
        return web.json_response(self.transcript(run))

    def transcript(self, run: str) -> dict[str, Any]:
        return self.sign(protocol.transcript(run, self.runs[run], self.keyid), protocol.TRANSCRIPT_TYPE)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[errors], client_max_size=protocol.MAX_REQUEST_BYTES)
        app.add_routes([
            web.get("/v1/witness", self.info),
            web.post("/v1/runs", self.open),
            web.post("/v1/runs/{run}/events", self.event),
            web.post("/v1/runs/{run}/pings", self.ping),
            web.post("/v1/runs/{run}/pongs", self.pong),
            web.post("/v1/runs/{run}/close", self.close),
            web.get("/v1/runs/{run}/transcript", self.get_transcript),
        ])
        return app


async def _serve(host: str, port: int, witness: Witness) -> None:
    runner = web.AppRunner(witness.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0] if runner.addresses else (host, port)
    print(f"mlckpt witness: listening on http://{bound[0]}:{bound[1]} (key fingerprint "
          f"{witness.keyid[:16]}, journal "
          f"{witness.journal.folder}, {len(witness.runs)} runs on record)", flush=True)
    # What a committee pastes under ``witnesses:`` in trusted-witnesses.yaml (docs: Witnessed runs).
    print(f'trusted-witnesses entry: NAME: ["{bundle.public_key_text(witness.key)}"]', flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def serve(listen: str, key_path: Path, journal_dir: Path) -> int:
    """Run the witness until SIGINT or SIGTERM."""
    from mlckpt.errors import UsageError

    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--listen: expected HOST:PORT, got {listen!r}", key="--listen")
    witness = Witness(Journal(journal_dir), bundle.load_private_key(key_path))
    try:
        asyncio.run(_serve(host.strip("[]"), int(port), witness))
    except OSError as exc:
        raise UsageError(f"--listen {listen}: {exc.strerror or exc}", key="--listen") from None
    print("mlckpt witness: stopped", file=sys.stderr, flush=True)
    return 0
