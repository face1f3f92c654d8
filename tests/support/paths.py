"""Where things are, for every test wherever its module sits."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
GOLDEN = TESTS / "golden"
LAB = REPO / "benchmarks" / "lab"  # the equipment the benchmarks share with the tests
