"""The sweep's closing table: every status in words, ratios only between ok rows, one name per
CSV column."""

from __future__ import annotations

import csv
from pathlib import Path

from mlckpt.cli import sweep
from mlckpt.errors import ExitStatus


def done(threads: int, status: int, write: float | None, read: float | None) -> sweep.Done:
    return sweep.Done(("ranks=8", f"io.threads={threads}"), status, None, write, read)


ROWS = [done(1, 0, 1.00, 2.00), done(4, 0, 0.50, 1.00), done(8, ExitStatus.DISTURBED, 3.00, 4.00),
        done(16, ExitStatus.INVALID, 1.50, None), done(32, 2, None, None)]


def test_each_status_in_words_and_no_ratio_above_one() -> None:
    head, rows = sweep.table(ROWS)
    assert head == ["io.threads", "status", "write GiB/s", "write vs best", "read GiB/s", "read vs best",
                    "bundle"]
    assert [r[1] for r in rows] == ["0 ok", "0 ok", "6 disturbed", "5 invalid", "2 refused"]
    assert rows[0][2:6] == ["1.00", "1.00", "2.00", "1.00"]
    assert rows[1][2:6] == ["0.50", "0.50", "1.00", "0.50"]
    # the disturbed row beat every ok row, but is no result: its rates, no ratio
    assert rows[2][2:6] == ["3.00", "", "4.00", ""]
    assert rows[3][2:6] == ["1.50", "", "", ""]
    assert rows[4][2:6] == ["", "", "", ""]
    ratios = [float(c) for r in rows for c in (r[3], r[5]) if c]
    assert max(ratios) == 1.0


def test_csv_has_one_name_per_column(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert sweep.finish(ROWS, tmp_path) == max(r.status for r in ROWS)
    [out] = tmp_path.glob("sweep-*.csv")
    head, *rows = list(csv.reader(out.open()))
    assert len(set(head)) == len(head) and len(rows) == len(ROWS)
    printed = capsys.readouterr().out
    assert "6 disturbed" in printed and "--- sweep of 5: 2 ok" in printed
