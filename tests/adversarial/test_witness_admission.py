"""Who may open a witnessed run and how much one opener may hold (mlckpt/witness/admission.py):
pure, every time given."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlckpt.witness.admission import Challenges, Ledger, Limits, Refusal

S = 1_000_000_000
FREE = 1 << 40


def test_a_challenge_is_good_once_within_its_time_and_only_from_this_witness() -> None:
    c = Challenges(b"k" * 32, ttl_s=120)
    token = c.issue(1000 * S)
    assert c.redeem(token, 1000 * S + 5 * S) is None
    assert c.redeem(token, 1000 * S + 6 * S) == "the challenge was already used (a replayed open)"
    late = c.issue(2000 * S)
    assert c.redeem(late, 2000 * S + 121 * S) == "the challenge expired (use it within 120 s)"
    future = c.issue(3000 * S)
    assert c.redeem(future, 3000 * S - S) == "the challenge expired (use it within 120 s)"
    other = Challenges(b"o" * 32).issue(1000 * S)
    assert c.redeem(other, 1000 * S) == "the challenge was not issued by this witness"
    assert c.redeem("zz.00", 0).startswith("the challenge is malformed")  # type: ignore[union-attr]
    stamp, _, mac = c.issue(4000 * S).partition(".")
    moved = f"{int(stamp, 16) - S:x}.{mac}"  # an older time under a real MAC
    assert c.redeem(moved, 4000 * S) == "the challenge was not issued by this witness"


def test_used_challenges_are_forgotten_once_they_could_no_longer_be_used() -> None:
    c = Challenges(b"k" * 32, ttl_s=1)
    for k in range(1000):
        assert c.redeem(c.issue(k * S), k * S) is None
    assert len(c._used) <= 2  # memory follows the opens of the last ttl, not history


def test_each_bound_names_itself_and_frees_when_a_run_ends() -> None:
    lim = Limits(max_open_per_key=2, opens_per_minute=3, max_open=3, journal_bytes_per_key=10_000)
    led = Ledger(lim)
    led.opened("a", "r1", 0, 100)
    led.opened("a", "r2", S, 100)
    assert led.admit("a", 2 * S, FREE) == Refusal(
        "this key holds 2 open runs, its bound (--max-open-per-key 2): close one, or wait for it to expire")
    assert led.admit("b", 2 * S, FREE) is None  # another key's share is its own
    led.ended("r1")
    assert led.admit("a", 3 * S, FREE) is None
    led.opened("a", "r3", 3 * S, 100)
    led.ended("r3")
    assert led.admit("a", 4 * S, FREE) == Refusal(
        "this key opened 3 runs in the last minute, its bound (--opens-per-minute 3): wait")
    assert led.admit("a", 61 * S, FREE) is None  # the first open left the minute
    led.opened("b", "r4", 5 * S, 100)
    led.opened("c", "r5", 5 * S, 100)
    refusal = led.admit("d", 6 * S, FREE)
    assert refusal == Refusal("the witness holds 3 open runs, its bound (--max-open): try later",
                              witness_wide=True)
    refusal = led.admit("d", 6 * S, 1 << 20)
    assert refusal is not None and refusal.witness_wide and refusal.reason.startswith(
        "the witness's journal has 1.00 MiB free, under its reserve of 256.00 MiB")


def test_a_keys_journal_bytes_bound_its_open_runs() -> None:
    led = Ledger(Limits(journal_bytes_per_key=1000))
    led.opened("a", "r", 0, 900)
    assert led.room("r", 50) is None
    assert led.room("r", 200) == ("the key that opened this run holds 900 B of journal in open runs, its "
                                  "bound (--journal-bytes-per-key 1000 B)")
    led.wrote("r", 200, S)
    assert led.admit("a", S, FREE) == Refusal(
        "this key's open runs hold 1.07 KiB of journal, its bound (--journal-bytes-per-key 1000 B)")
    led.ended("r")
    assert led.admit("a", S, FREE) is None and "a" in led.holders  # its opens still count for a minute
    assert led.holders["a"].journal_bytes == 0


def test_quiet_runs_are_found_for_expiry() -> None:
    led = Ledger(Limits(expire_after_s=10))
    led.opened("a", "r1", 0, 1)
    led.opened("a", "r2", 0, 1)
    led.wrote("r2", 1, 8 * S)
    assert led.idle(9 * S) == []
    assert led.idle(11 * S) == [("r1", 11.0)]
    assert [r for r, _ in led.idle(18 * S)] == ["r1", "r2"]


@pytest.mark.parametrize("field, value, says", [
    ("max_open_per_key", 0, "--max-open-per-key: must be at least 1"),
    ("opens_per_minute", 0, "--opens-per-minute: must be at least 1"),
    ("expire_after_s", 0, "--expire-after: must be positive"),
    ("min_free_bytes", -1, "--min-free: must not be negative"),
])
def test_limits_that_cannot_be_served_are_named(field: str, value: float, says: str) -> None:
    assert Limits(**{field: value}).problem() == says
    assert Limits().problem() is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.booleans(), st.integers(0, 5 * S)), max_size=60))
def test_the_ledger_never_lets_a_key_past_its_bounds(steps: list[tuple[str, bool, int]]) -> None:
    lim = Limits(max_open_per_key=2, opens_per_minute=4, max_open=4)
    led, now, n = Ledger(lim), 0, 0
    for key, opening, dt in steps:
        now += dt
        if opening:
            if led.admit(key, now, FREE) is None:
                n += 1
                led.opened(key, f"r{n}", now, 10)
        else:
            mine = sorted(r for r, k in led.opener.items() if k == key)
            if mine:
                led.ended(mine[0])
        assert led.open_runs <= lim.max_open
        for h in led.holders.values():
            assert len(h.runs) <= lim.max_open_per_key
            assert len([t for t in h.opens if now - t < 60 * S]) <= lim.opens_per_minute
            assert h.journal_bytes == 10 * len(h.runs)
