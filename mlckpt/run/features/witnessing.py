"""A witnessed run as the ranks see it (``witness.url``).

Rank 0 alone talks to the witness; the other ranks learn each write's nonce from it through a
broadcast before the op's barrier.  Per op: the start is reported before the barrier (the witness's
clock starts before any byte of the op moves) and the end after every rank agreed the op is over
(durable, for writes).  The first failure of the witness (unreachable, a refusal, a timeout of
``witness.timeout_s``) ends the witnessing: the run goes on, says so once, and its bundle is not
witnessed.  What goes into the bundle: run.json's ``witness`` block (:meth:`Witnessing.block`)
and the signed transcript (``witness.dsse.json``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mlckpt import __version__
from mlckpt.errors import ConfigError
from mlckpt.plan.settings import Settings
from mlckpt.run.collective import Job
from mlckpt.witness.client import DEFAULT_TIMEOUT_S, Client, WitnessError, transcript_of

TRANSCRIPT_FILE = "witness.dsse.json"
KEY = "witness.url"


def endpoint(url: str) -> str:
    """What run.json records of the URL: scheme, host and port (never credentials or a path)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}"


@dataclass
class Witnessing:
    job: Job
    url: str
    client: Client | None = None  # rank 0 while the witness answers
    keyid: str = ""
    run: str = ""
    lost: str | None = None
    nonces: dict[int, str] = field(default_factory=dict)  # write index -> nonce
    transcript: dict[str, object] | None = None  # the signed envelope, once closed
    # Rank 0's perf counter when the op's start was answered and when its end was sent: the host's
    # own share of the witness's interval (records' witness_host_ns).
    answered_ns: int | None = None
    sent_ns: int | None = None

    @classmethod
    def open(cls, job: Job, run: Settings, plan_digest: str, run_id: int, name: str,
             key: Ed25519PrivateKey | None = None) -> Witnessing | None:
        """Open the witnessed run before any I/O (collective), the open signed with rank 0's
        signing ``key``; None when no witness is asked for.  A witness that cannot be reached now,
        or that refuses the key, or whose key is not ``witness.public_key``, refuses the run (one
        line, exit 2): the operator asked for a witnessed result."""
        w = run.witness
        if w.url is None:
            return None
        url, timeout = w.url, w.timeout_s or DEFAULT_TIMEOUT_S
        me = cls(job, url)
        problem = None
        if job.rank == 0 and key is None:
            problem = (f"{KEY}: a witness opens a run only for a key it trusts, and signing.key=none "
                       "signs nothing: give signing.key (auto, or a key path)")
        elif job.rank == 0:
            try:
                client = Client(url, timeout, key=key, expect=w.public_key, ca_file=w.ca_file)
                info = client.info()
                opened = client.open(plan_digest, _opening(run, run_id, name), f"mlckpt {__version__}")
                me.client, me.keyid, me.run = client, str(info["keyid"]), str(opened["run"])
            except (WitnessError, KeyError, TypeError, OSError) as exc:  # OSError: an unreadable ca_file
                problem = f"{KEY}: cannot open a witnessed run at {endpoint(url)}: {exc}"
        problem = job.comm.bcast(problem)
        if problem:
            raise ConfigError(problem, key=KEY)
        job.say(f"witnessed by {endpoint(url)} (witness key fingerprint {me.keyid[:16]}, run {me.run})")
        return me

    def _lose(self, what: str, exc: Exception) -> None:
        self.lost = f"{what}: {exc}"
        self.client = None
        self.job.say(f"warning: the witness {endpoint(self.url)} failed at {what} ({exc}): the run goes "
                     "on; its bundle will not be witnessed")

    def start(self, op: str, index: int) -> str | None:
        """Report an op's start (rank 0) before its barrier; every rank gets a write's nonce
        (collective), or None once the witness is lost."""
        nonce = None
        self.answered_ns = self.sent_ns = None
        if self.client is not None:
            try:
                nonce = self.client.event("start", op, index).get("nonce")
                self.answered_ns = self.client.answered_ns
            except WitnessError as exc:
                self._lose(f"{op} {index} start", exc)
        nonce = self.job.comm.bcast(nonce)
        if nonce is not None:
            self.nonces[index] = str(nonce)
        return nonce

    def end(self, op: str, index: int) -> None:
        """Report an op's end (rank 0), once every rank agreed it is over."""
        if self.client is not None:
            try:
                self.client.event("end", op, index)
                self.sent_ns = self.client.sent_ns
            except WitnessError as exc:
                self._lose(f"{op} {index} end", exc)

    def host_ns(self, t0_ns: int, t1_ns: int) -> list[int] | None:
        """Rank 0's time from the start's answer to its op's start (``t0_ns``: the nonce's
        broadcast and seal, the op's barriers) and from its op's end (``t1_ns``) to sending the end
        (the closing barrier and agreement), on its perf counter; None elsewhere or once lost."""
        if self.client is None or self.answered_ns is None or self.sent_ns is None:
            return None
        return [max(0, t0_ns - self.answered_ns), max(0, self.sent_ns - t1_ns)]

    def close(self) -> None:
        """Rank 0, after the last op: two measured round trips, then the close and its signed
        transcript."""
        if self.client is None:
            return
        try:
            for _ in range(2):
                self.client.round_trip()
            self.transcript = self.client.close()["transcript"]
        except (WitnessError, KeyError, TypeError) as exc:
            self._lose("close", exc if isinstance(exc, WitnessError) else WitnessError(repr(exc)))
            self.transcript = None

    @property
    def witnessed(self) -> bool:
        """The witness answered to the end: its transcript goes into the bundle."""
        return self.transcript is not None and self.lost is None

    def block(self, num_writes: int) -> dict[str, object]:
        """run.json's ``witness``: who witnessed, and whether the transcript is in the bundle."""
        return {
            "endpoint": endpoint(self.url),
            "keyid": self.keyid,
            "run": self.run,
            "status": "witnessed" if self.witnessed else "lost",
            "reason": self.lost,
            "nonces": [self.nonces.get(k) for k in range(1, num_writes + 1)],
            "transcript": TRANSCRIPT_FILE if self.witnessed else None,
        }

    def document(self) -> dict[str, object] | None:
        """The transcript's document (its signature was checked as it arrived), for the rules
        that read it; None when not witnessed."""
        return transcript_of(self.transcript) if self.witnessed and self.transcript is not None else None

    def transcript_bytes(self) -> bytes | None:
        if not self.witnessed:
            return None
        return json.dumps(self.transcript, indent=1).encode() + b"\n"


def _opening(run: Settings, run_id: int, name: str) -> dict[str, object]:
    """What the witness is told about the run at its opening (bound into the transcript)."""
    return {"run_id": f"{run_id:016x}", "name": name, "workload": run.workload, "ranks": run.ranks,
            "division": run.division, "scale": run.scale, "num_writes": run.checkpoint.num_writes,
            "num_reads": run.checkpoint.num_reads, "rules_version": run.rules_version,
            "mlckpt_version": __version__}

