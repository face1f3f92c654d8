"""Units: parsing and formatting of sizes, durations, bandwidths and fractions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlckpt.units import (
    GB,
    KB,
    MB,
    TB,
    GiB,
    KiB,
    MiB,
    TiB,
    fmt_bytes,
    fmt_bytes_both,
    fmt_duration,
    fmt_share,
    parse_bandwidth,
    parse_duration,
    parse_fraction,
    parse_size,
)


def test_constants() -> None:
    assert (KiB, MiB, GiB, TiB) == (1024, 1024**2, 1024**3, 1024**4)
    assert (KB, MB, GB, TB) == (1000, 10**6, 10**9, 10**12)


@pytest.mark.parametrize(("text", "value"), [
    ("4096", 4096),
    ("0", 0),
    ("4MiB", 4 * MiB),
    ("4M", 4 * MiB),
    ("4 MiB", 4 * MiB),
    ("  4mib ", 4 * MiB),
    ("4MB", 4 * MB),
    ("1.5GB", 1_500_000_000),
    ("1.5GiB", 3 * GiB // 2),
    ("2g", 2 * GiB),
    ("1T", TiB),
    ("1TB", TB),
    ("1tib", TiB),
    ("8k", 8192),
    ("8KB", 8000),
    ("100b", 100),
    ("1e3", 1000),
    ("1E3KB", 10**6),
    (".5KiB", 512),
    ("104.70 GiB", round(104.70 * GiB)),
])
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value
    assert isinstance(parse_size(text), int)


@pytest.mark.parametrize("text", ["", "abc", "4XB", "-1", "4 M B", "1e999", "1.2.3", "4MiB/s", "GiB", "0x10"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


@pytest.mark.parametrize(("text", "value"), [
    ("90", 90.0), ("90s", 90.0), ("90 sec", 90.0), ("30m", 1800.0), ("30min", 1800.0), ("1.5h", 5400.0),
    ("2H", 7200.0), ("1d", 86400.0), ("0.5", 0.5), ("1e2", 100.0),
])
def test_parse_duration(text: str, value: float) -> None:
    assert parse_duration(text) == value


@pytest.mark.parametrize(("text", "why"), [
    ("30x", "not a duration"), ("", "not a duration"), ("-5", "not a duration"), ("1w", "not a duration"),
    ("0", "not a positive duration"), ("0m", "not a positive duration"), ("1e999", "not a positive duration"),
])
def test_parse_duration_rejects(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_duration(text)


@pytest.mark.parametrize(("text", "value"), [
    ("100GiB/s", 100 * GiB), ("100 GB/s", 100 * GB), ("25GB / s", 25 * GB), ("1.5 TiB/s", 1.5 * TiB),
    ("4096/s", 4096), ("800MB/s", 800 * MB), ("10g/s", 10 * GiB),
])
def test_parse_bandwidth(text: str, value: float) -> None:
    assert parse_bandwidth(text) == value


@pytest.mark.parametrize(("text", "why"), [
    ("10GiB", "not a bandwidth"), ("10XB/s", "not a bandwidth"), ("GB/s", "not a bandwidth"),
    ("10GB/h", "not a bandwidth"), ("-1GB/s", "not a bandwidth"),
    ("0GB/s", "not a positive bandwidth"), ("1e999GB/s", "not a positive bandwidth"),
])
def test_parse_bandwidth_rejects(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_bandwidth(text)


@pytest.mark.parametrize(("text", "value"), [
    ("5%", 0.05), ("0.05", 0.05), (" 12.5% ", 0.125), ("99%", 0.99), ("1e-3", 0.001),
])
def test_parse_fraction(text: str, value: float) -> None:
    assert parse_fraction(text) == pytest.approx(value)


@pytest.mark.parametrize(("text", "why"), [
    ("abc", "not a fraction"), ("%", "not a fraction"), ("", "not a fraction"),
    ("0", r"must be in \(0, 1\)"), ("1", r"must be in \(0, 1\)"), ("100%", r"must be in \(0, 1\)"),
    ("150%", r"must be in \(0, 1\)"), ("-5%", r"must be in \(0, 1\)"), ("nan", r"must be in \(0, 1\)"),
    ("inf", r"must be in \(0, 1\)"),
])
def test_parse_fraction_rejects(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_fraction(text)


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"), (MiB, "1.00 MiB"),
    (112_425_623_552, "104.70 GiB"), (16_564_174_094_592, "15.07 TiB"), (1.5, "1 B"),
])
def test_fmt_bytes(n: float, text: str) -> None:
    assert fmt_bytes(n) == text


@pytest.mark.parametrize(("n", "text"), [
    (112_425_623_552, "104.70 GiB / 112.43 GB"),
    (16_564_174_094_592, "15.07 TiB / 16.56 TB"),
    (512, "512 B / 512.00 B"),
    (1000, "1000 B / 1.00 KB"),
])
def test_fmt_bytes_both(n: int, text: str) -> None:
    assert fmt_bytes_both(n) == text


@pytest.mark.parametrize(("s", "text"), [
    (0.5, "0.50 s"), (59, "59.00 s"), (60, "1.00 min"), (90, "1.50 min"), (3599, "59.98 min"),
    (3600, "1.00 h"), (5400, "1.50 h"),
])
def test_fmt_duration(s: float, text: str) -> None:
    assert fmt_duration(s) == text


# ---------------------------------------------------------------------------------------------
# Round trips.

UNITS = {"B": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB, "KB": KB, "MB": MB, "GB": GB, "TB": TB}


@settings(max_examples=300)
@given(st.integers(0, 10**6), st.sampled_from(sorted(UNITS)))
def test_parse_size_exact_round_trip(k: int, unit: str) -> None:
    assert parse_size(f"{k}{unit}") == k * UNITS[unit]
    assert parse_size(f"{k} {unit.lower()}") == k * UNITS[unit]


@settings(max_examples=300)
@given(st.integers(0, 2**62))
def test_fmt_then_parse_size_within_rounding(n: int) -> None:
    back = parse_size(fmt_bytes(n))
    assert abs(back - n) <= 0.005 * n + 1  # two decimals of a value >= 1 in its unit


@settings(max_examples=200)
@given(st.floats(min_value=1.0, max_value=1e7, allow_nan=False, allow_infinity=False))
def test_fmt_then_parse_duration_within_rounding(s: float) -> None:
    assert parse_duration(fmt_duration(s)) == pytest.approx(s, rel=0.005, abs=0.005)


@settings(max_examples=200)
@given(st.integers(1, 10**6), st.sampled_from(sorted(UNITS)))
def test_parse_bandwidth_round_trip(k: int, unit: str) -> None:
    assert parse_bandwidth(f"{k}{unit}/s") == k * UNITS[unit]


@settings(max_examples=200)
@given(st.integers(1, 99))
def test_parse_fraction_percent_equals_decimal(pct: int) -> None:
    assert parse_fraction(f"{pct}%") == pytest.approx(parse_fraction(str(pct / 100)))


@pytest.mark.parametrize(("value", "bound", "digits", "shown"), [
    (0.953, 0.95, 0, "95.3%"),  # never "at most 95% ... got 95%"
    (0.9501, 0.95, 0, "95.01%"),
    (0.95, 0.95, 0, "95%"),  # at the bound: the bound's own figure
    (0.40, 0.95, 0, "40%"),
    (0.0504, 0.05, 1, "5.04%"),
    (0.123, 0.05, 1, "12.3%"),
    (0.95000001, 0.95, 0, "95.000%"),  # three decimals at most
    (0.7, None, 0, "70%"),
])
def test_a_share_never_reads_as_the_bound_it_breaks(value: float, bound: float | None, digits: int,
                                                    shown: str) -> None:
    assert fmt_share(value, bound, digits) == shown


@given(st.floats(0, 10), st.floats(0, 10))
def test_a_share_never_prints_as_its_bound_where_they_differ_by_two_thousandths_of_a_percent(
        value: float, bound: float) -> None:
    """Printed with as many decimals as the share is, the bound reads otherwise."""
    if abs(value - bound) >= 2e-5:
        shown = fmt_share(value, bound)
        decimals = len(shown.rstrip("%").partition(".")[2])
        assert shown != f"{bound:.{decimals}%}"
