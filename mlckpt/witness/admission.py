"""Who may open a witnessed run, and how much of the witness one opener may hold.  Pure: every
function takes the time it judges at; the server supplies its clocks.

A run is opened only by a request signed with a key of the witness's trusted-keys file (the keys
that sign bundles), carrying a challenge the witness issued a moment before: a captured request
cannot be replayed later, and a stranger is refused after one signature check, before anything
is stored.  Challenges cost the witness no memory until used (each is its issue time and an HMAC
under a secret of the process); a used one is remembered only until it would have expired.

Bounds (``Limits``) per opener key and overall keep the witness's disk and memory proportional to
the runs open now, not to its history: runs open at once, opens per minute, journal bytes of open
runs, and how long a run may go without an event before it expires.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import deque
from dataclasses import dataclass, field

from mlckpt.units import fmt_bytes

CHALLENGE_TTL_S = 120.0  # a challenge must be used within this (the open is its next request)


@dataclass(frozen=True)
class Limits:
    max_open_per_key: int = 4  # runs one key holds open at once
    opens_per_minute: int = 12  # opens one key may make in any 60 s
    max_open: int = 256  # runs open at once, all keys together
    journal_bytes_per_key: int = 64 << 20  # journal bytes of one key's open runs
    expire_after_s: float = 24 * 3600.0  # a run without an event for this long expires
    min_free_bytes: int = 256 << 20  # free space the journal keeps for the runs already open

    def problem(self) -> str | None:
        """Why these limits cannot be served (one line naming the option), or None."""
        for name in ("max_open_per_key", "opens_per_minute", "max_open", "journal_bytes_per_key"):
            if getattr(self, name) < 1:
                return f"--{name.replace('_', '-')}: must be at least 1"
        if self.expire_after_s <= 0:
            return "--expire-after: must be positive"
        if self.min_free_bytes < 0:
            return "--min-free: must not be negative"
        return None


class Challenges:
    """Challenges of the form ``<issue time ns, hex>.<HMAC>``, checked without stored state."""

    def __init__(self, secret: bytes, ttl_s: float = CHALLENGE_TTL_S) -> None:
        self._secret = secret
        self.ttl_ns = int(ttl_s * 1e9)
        self._used: dict[str, int] = {}  # challenge -> issue time, until it expires

    def _mac(self, stamp: str) -> str:
        return hmac.new(self._secret, stamp.encode(), hashlib.sha256).hexdigest()[:32]

    def issue(self, now_ns: int) -> str:
        stamp = f"{now_ns:x}"
        return f"{stamp}.{self._mac(stamp)}"

    def redeem(self, challenge: str, now_ns: int) -> str | None:
        """Why ``challenge`` is not good for one open now (one line), or None (and it is spent)."""
        stamp, _, mac = challenge.partition(".")
        try:
            issued = int(stamp, 16)
        except ValueError:
            return "the challenge is malformed (GET /v1/challenge, then sign the open with it)"
        if not hmac.compare_digest(mac, self._mac(stamp)):
            return "the challenge was not issued by this witness"
        if not 0 <= now_ns - issued <= self.ttl_ns:
            return f"the challenge expired (use it within {self.ttl_ns / 1e9:g} s)"
        self._used = {c: t for c, t in self._used.items() if now_ns - t <= self.ttl_ns}
        if challenge in self._used:
            return "the challenge was already used (a replayed open)"
        self._used[challenge] = issued
        return None


@dataclass(frozen=True)
class Refusal:
    """Why an open is refused: ``witness_wide`` when the witness as a whole is at a bound (try
    later), not the opener's own share."""
    reason: str
    witness_wide: bool = False


@dataclass
class Holder:
    """What one opener key holds now."""
    runs: set[str] = field(default_factory=set)
    opens: deque[int] = field(default_factory=deque)  # open times (ns) in the last minute
    journal_bytes: int = 0


class Ledger:
    """The open runs by opener key, and each run's last event: what every bound is judged on."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.holders: dict[str, Holder] = {}
        self.opener: dict[str, str] = {}  # open run -> its opener keyid
        self.last_event_ns: dict[str, int] = {}  # open run -> monotonic time of its last event
        self.run_bytes: dict[str, int] = {}

    @property
    def open_runs(self) -> int:
        return len(self.opener)

    def admit(self, keyid: str, now_ns: int, free_bytes: int) -> Refusal | None:
        """Why ``keyid`` may not open a run now (one line naming the bound), or None."""
        lim, h = self.limits, self.holders.get(keyid, Holder())
        while h.opens and now_ns - h.opens[0] >= 60_000_000_000:
            h.opens.popleft()
        if free_bytes < lim.min_free_bytes:
            return Refusal(f"the witness's journal has {fmt_bytes(free_bytes)} free, under its reserve of "
                           f"{fmt_bytes(lim.min_free_bytes)} for the runs already open (--min-free): no new "
                           "run", witness_wide=True)
        if self.open_runs >= lim.max_open:
            return Refusal(f"the witness holds {lim.max_open} open runs, its bound (--max-open): try later",
                           witness_wide=True)
        if len(h.runs) >= lim.max_open_per_key:
            return Refusal(f"this key holds {len(h.runs)} open runs, its bound (--max-open-per-key "
                           f"{lim.max_open_per_key}): close one, or wait for it to expire")
        if len(h.opens) >= lim.opens_per_minute:
            return Refusal(f"this key opened {len(h.opens)} runs in the last minute, its bound "
                           f"(--opens-per-minute {lim.opens_per_minute}): wait")
        if h.journal_bytes >= lim.journal_bytes_per_key:
            return Refusal(f"this key's open runs hold {fmt_bytes(h.journal_bytes)} of journal, its bound "
                           f"(--journal-bytes-per-key {fmt_bytes(lim.journal_bytes_per_key)})")
        return None

    def opened(self, keyid: str, run: str, now_ns: int, nbytes: int) -> None:
        h = self.holders.setdefault(keyid, Holder())
        h.runs.add(run)
        h.opens.append(now_ns)
        self.opener[run] = keyid
        self.run_bytes[run] = 0
        self.wrote(run, nbytes, now_ns)

    def room(self, run: str, nbytes: int) -> str | None:
        """Why ``run`` may not journal ``nbytes`` more (its opener's byte bound), or None."""
        h = self.holders[self.opener[run]]
        if h.journal_bytes + nbytes > self.limits.journal_bytes_per_key:
            bound = fmt_bytes(self.limits.journal_bytes_per_key)
            return (f"the key that opened this run holds {fmt_bytes(h.journal_bytes)} of journal in open "
                    f"runs, its bound (--journal-bytes-per-key {bound})")
        return None

    def wrote(self, run: str, nbytes: int, now_ns: int) -> None:
        self.holders[self.opener[run]].journal_bytes += nbytes
        self.run_bytes[run] += nbytes
        self.last_event_ns[run] = now_ns

    def ended(self, run: str) -> None:
        """The run closed or expired: its opener's bounds no longer count it."""
        keyid = self.opener.pop(run)
        h = self.holders[keyid]
        h.runs.discard(run)
        h.journal_bytes -= self.run_bytes.pop(run)
        self.last_event_ns.pop(run, None)
        if not h.runs and not h.opens:
            del self.holders[keyid]

    def idle(self, now_ns: int) -> list[tuple[str, float]]:
        """Open runs without an event for ``expire_after_s``, with how long (s)."""
        bound = self.limits.expire_after_s * 1e9
        return [(run, (now_ns - t) / 1e9) for run, t in sorted(self.last_event_ns.items())
                if now_ns - t >= bound]
