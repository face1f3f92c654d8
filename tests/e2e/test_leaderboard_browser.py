"""The leaderboard page in real headless Chromium (selenium + Debian's chromedriver).

Skipped, with the reason, when Chromium, chromedriver or selenium is missing (CI installs them:
``apt-get install chromium chromium-driver``, ``pip install '.[test]'``).  The page is loaded from
``file://`` with the network-silencing flags, so any fetch it tried would fail and show up as a
console error or a resource entry.  A full-page screenshot is saved to the test's tmp dir, and to
``$MLCKPT_SCREENSHOT_DIR`` when set.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest
from support.browser import chromium, missing
from support.synthetic import GOLDEN_TREE, build_tree, lb_cli

from checker.leaderboard import COLUMNS, fmt
from checker.leaderboard.render import PAGE_OMITS

PAGE_COLUMNS = [c for c in COLUMNS if c.key not in PAGE_OMITS]  # the page's tables: no division column

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("site")
    root = build_tree(base / "tree", GOLDEN_TREE)
    page = base / "pub" / "index.html"
    lb_cli(root, "html", page)
    doc = json.loads(lb_cli(root, "json", base / "pub" / "leaderboard.json"))
    return {"base": base, "root": root, "page": page, "json": doc}


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with chromium() as d:
        yield d


def _open(driver: Any, page: Path) -> Any:
    """Load the page and wait until plotly has drawn every chart."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(page.as_uri())
    want = len(_figures(driver))
    WebDriverWait(driver, 30).until(
        lambda d: d.execute_script("return document.querySelectorAll('.js-plotly-plot .main-svg').length")
        >= want)
    return driver


@pytest.fixture(scope="module")
def loaded(driver: Any, site: dict[str, Any]) -> Any:
    return _open(driver, site["page"])


def _figures(d: Any) -> dict[str, Any]:
    return json.loads(d.execute_script("return document.getElementById('lb-figures').textContent"))


def _table_cells(d: Any, class_id: str) -> list[list[str]]:
    return d.execute_script(
        "return Array.from(document.querySelectorAll('#table-' + arguments[0] + ' tbody tr'))"
        # a cell's own value: the System cell's is its <summary> (the SUT block opens below it), the
        # result id's its first link (the run's report link follows it)
        ".map(r => Array.from(r.cells).map(c => (c.querySelector('summary') || "
        "(c.querySelector('a.run-report') ? c.querySelector('a') : c)).textContent));", class_id)


def _column(d: Any, class_id: str, key: str) -> list[str]:
    idx = [c.key for c in PAGE_COLUMNS].index(key)
    return [row[idx] for row in _table_cells(d, class_id)]


def _click(d: Any, class_id: str, key: str) -> str:
    from selenium.webdriver.common.by import By

    th = d.find_element(By.CSS_SELECTOR, f'#table-{class_id} thead th[data-key="{key}"]')
    th.find_element(By.TAG_NAME, "button").click()
    return str(th.get_attribute("aria-sort"))


def test_no_console_errors_and_no_network(loaded: Any) -> None:
    severe = [e for e in loaded.get_log("browser") if e.get("level") == "SEVERE"]
    assert severe == []
    resources = loaded.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert resources == []  # everything is inline: not one request


def test_charts_are_drawn(loaded: Any, site: dict[str, Any]) -> None:
    figs = _figures(loaded)
    assert len(figs) == len(site["json"]["classes"]) + 1  # a bar chart per class, one scaling chart
    for cid, fig in figs.items():
        n_svg = loaded.execute_script(
            "return document.querySelectorAll('#' + arguments[0] + ' svg.main-svg').length", cid)
        assert n_svg >= 1, cid
        if cid.startswith("chart-bars-"):
            bars = loaded.execute_script(
                "return document.querySelectorAll('#' + arguments[0] + ' g.trace.bars g.point').length", cid)
            assert bars == 2 * len(fig["data"][0]["x"]), cid  # write and read per result
        else:
            lines = loaded.execute_script(
                "return document.querySelectorAll('#' + arguments[0] + ' g.trace.scatter').length", cid)
            assert lines == len(fig["data"])


def test_a_system_cell_opens_its_system_under_test(loaded: Any, site: dict[str, Any]) -> None:
    """The System cell shows the system's name; a click opens what its description says."""
    cell = loaded.find_element("css selector", "table.lb tbody tr td.col-system details.sut")
    summary = cell.find_element("css selector", "summary")
    facts = cell.find_element("css selector", "dl")
    assert not facts.is_displayed()  # closed: the table stays one line per result
    summary.click()
    assert facts.is_displayed()
    text = facts.text
    assert "Storage product" in text and "Usable capacity (TiB)" in text and "Availability" in text
    row = loaded.execute_script("return arguments[0].closest('tr').dataset.id", cell)
    [entry] = [r for cls in site["json"]["classes"] for r in cls["rows"] if r["result_id"] == row]
    assert f"{entry['system']} storage" in text  # this system's own description (the test tree's)
    summary.click()
    assert not facts.is_displayed()


def test_table_values_match_the_json_output(loaded: Any, site: dict[str, Any]) -> None:
    for cls in site["json"]["classes"]:
        cells = _table_cells(loaded, cls["id"])
        expected = [[fmt(row[c.key], c) for c in PAGE_COLUMNS] for row in cls["rows"]]
        assert cells == expected, cls["id"]
    headers = loaded.execute_script(
        "return Array.from(document.querySelectorAll('table.lb')[0].tHead.rows[0].cells)"
        ".map(h => h.querySelector('.name').textContent + '|' + "
        "(h.querySelector('.unit') ? h.querySelector('.unit').textContent : ''))")
    assert headers == [f"{c.name}|{c.unit}" for c in PAGE_COLUMNS]


def test_every_row_links_to_its_bundle(loaded: Any, site: dict[str, Any]) -> None:
    links = loaded.execute_script(
        "return Array.from(document.querySelectorAll('table.lb tbody tr')).map("
        "r => [r.dataset.id, r.cells[0].querySelector('a').href])")
    rows = {r["result_id"]: r["bundle"] for c in site["json"]["classes"] for r in c["rows"]}
    assert len(links) == len(rows)
    for rid, href in links:
        target = Path(unquote(urlparse(href).path))
        assert target.exists(), href
        assert target.resolve() == (site["root"] / rows[rid]).resolve()


def test_clicking_a_header_sorts_both_ways(loaded: Any, site: dict[str, Any]) -> None:
    cls = next(c for c in site["json"]["classes"] if c["id"] == "open-llama3_8b-x0_01")
    cid, rows = cls["id"], cls["rows"]
    order = {r["result_id"]: i for i, r in enumerate(rows)}

    def ids() -> list[str]:
        return _column(loaded, cid, "result_id")

    assert ids() == [r["result_id"] for r in rows]  # as published: write bandwidth, highest first
    # Numeric column: highest first, then reversed; ties keep the published order.
    assert _click(loaded, cid, "ranks") == "descending"
    assert ids() == [r["result_id"] for r in sorted(rows, key=lambda r: (-r["ranks"], order[r["result_id"]]))]
    assert _column(loaded, cid, "ranks")[0] == "16"  # numeric order (as text, "8" > "16")
    assert _click(loaded, cid, "ranks") == "ascending"
    assert ids() == [r["result_id"] for r in sorted(rows, key=lambda r: (r["ranks"], order[r["result_id"]]))]
    assert _click(loaded, cid, "read_gib_s") == "descending"
    got = [float(v) for v in _column(loaded, cid, "read_gib_s")]
    assert got == sorted(got, reverse=True)
    assert _click(loaded, cid, "read_gib_s") == "ascending"
    assert [float(v) for v in _column(loaded, cid, "read_gib_s")] == sorted(got)
    # Text column: A→Z first, then Z→A.
    assert _click(loaded, cid, "mode") == "ascending"
    by_mode = sorted(rows, key=lambda r: (r["mode"].lower(), order[r["result_id"]]))
    assert ids() == [r["result_id"] for r in by_mode]
    assert _click(loaded, cid, "mode") == "descending"
    modes = _column(loaded, cid, "mode")
    assert modes == sorted(modes, key=str.lower, reverse=True)
    # The published order again: the write column was sorted descending, one click reverses it.
    assert _click(loaded, cid, "write_gib_s") == "descending"
    assert ids() == [r["result_id"] for r in rows]
    assert _click(loaded, cid, "write_gib_s") == "ascending"
    assert ids() == [r["result_id"] for r in reversed(rows)]
    # Missing values stay last in both directions.
    nr = next(c for c in site["json"]["classes"] if c["id"] == "open-llama_7b_zero3-full")["id"]
    for _ in range(2):
        _click(loaded, nr, "read_gib_s")
        assert _column(loaded, nr, "read_gib_s")[-1] == "—"


def test_stall_and_time_to_durable_columns(loaded: Any, site: dict[str, Any]) -> None:
    """The new columns show the JSON's values and sort numerically; the pipelined classes name
    their mode in the header badge and in every row's Mode cell."""
    _open(loaded, site["page"])  # as published (other tests sort the tables)
    classes = {c["id"]: c for c in site["json"]["classes"]}
    cls = classes["open-llama3_8b-x0_01-async"]
    cid, rows = cls["id"], cls["rows"]
    assert len(rows) == 2
    for key in ("stall_s", "time_to_durable_s"):
        assert _column(loaded, cid, key) == [f"{r[key]:.3f}" for r in rows]
    # A back-pressured result (zeta) stalls longer than acme's, though acme ranks first on write.
    assert rows[0]["stall_s"] < rows[1]["stall_s"]
    order = {r["result_id"]: i for i, r in enumerate(rows)}
    assert _click(loaded, cid, "stall_s") == "descending"
    assert _column(loaded, cid, "result_id") == [
        r["result_id"] for r in sorted(rows, key=lambda r: (-r["stall_s"], order[r["result_id"]]))]
    assert _click(loaded, cid, "stall_s") == "ascending"
    got = [float(v) for v in _column(loaded, cid, "stall_s")]
    assert got == sorted(r["stall_s"] for r in rows)
    assert _click(loaded, cid, "time_to_durable_s") == "descending"
    got = [float(v) for v in _column(loaded, cid, "time_to_durable_s")]
    assert got == sorted((r["time_to_durable_s"] for r in rows), reverse=True)
    # Sync, one tier: training waits until durable, so both columns equal the write duration.
    for r in classes["open-llama3_8b-x0_01"]["rows"]:
        assert r["stall_s"] == r["time_to_durable_s"] == r["write_duration_s"]
    # Every restore from the fast tier: the read columns are empty, not the fast tier's numbers.
    tiered = classes["open-llama3_8b-x0_01-async-tiers"]
    assert _column(loaded, tiered["id"], "read_gib_s") == ["—"]
    assert _column(loaded, tiered["id"], "stall_s") == [f"{tiered['rows'][0]['stall_s']:.3f}"]
    for c in classes.values():
        badge = loaded.execute_script(
            "var b = document.querySelector('#' + arguments[0] + ' h3 .badge-pipeline');"
            "return b ? b.textContent : null;", c["id"])
        assert badge == (None if c["pipeline"] == "sync" else c["pipeline"]), c["id"]
        assert all(m.startswith(c["pipeline"] + ", ") for m in _column(loaded, c["id"], "mode")), c["id"]


def test_no_table_scrolls_sideways_on_a_1400_px_window(loaded: Any, site: dict[str, Any]) -> None:
    _open(loaded, site["page"])
    loaded.set_window_size(1400, 1000)
    over = loaded.execute_script(
        "return [...document.querySelectorAll('.table-wrap')].map(b => [b.querySelector('table').id, "
        "b.scrollWidth - b.clientWidth]).filter(([, o]) => o > 0)")
    page = loaded.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    assert over == [] and page <= 0, (over, page)
    # a class's division is its heading's: the page's tables leave the column out, the JSON keeps it
    heads = loaded.execute_script(
        "return [...document.querySelectorAll('table.lb th')].map(t => t.className)")
    assert not any("col-division" in h for h in heads) and heads


def test_screenshot(loaded: Any, site: dict[str, Any], tmp_path: Path) -> None:
    _open(loaded, site["page"])  # as published (other tests sort the tables)
    height = int(loaded.execute_script("return document.documentElement.scrollHeight"))
    loaded.set_window_size(1400, min(height + 40, 8000))
    shot = tmp_path / "leaderboard.png"
    assert loaded.save_screenshot(str(shot))
    assert shot.stat().st_size > 50_000
    out_dir = os.environ.get("MLCKPT_SCREENSHOT_DIR")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(out_dir) / "leaderboard.png")
    loaded.set_window_size(1400, 1000)


def test_each_result_links_its_runs_own_page_and_it_draws_offline(driver: Any,
                                                                  site: dict[str, Any]) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _open(driver, site["page"])
    links = driver.find_elements(By.CSS_SELECTOR, "a.run-report")
    from checker.leaderboard.collect import is_archive

    rows = [r for c in site["json"]["classes"] for r in c["rows"] if not is_archive(Path(r["bundle"]))]
    assert len(links) == len(rows) > 0  # a result kept as an archive has no page (not unpacked)
    runs = site["page"].parent / "index-runs"
    assert sorted(p.name for p in runs.iterdir()) == sorted([f"{r['result_id']}.html" for r in rows]
                                                            + ["plotly.min.js"])  # plotly.js once
    first = links[0].get_attribute("href")
    driver.get(first)
    WebDriverWait(driver, 30).until(
        lambda d: d.execute_script("return document.querySelectorAll('.js-plotly-plot .main-svg').length")
        >= 2)
    ranks = driver.execute_script("return document.getElementById('ranks').data")
    assert ranks and all(isinstance(y, float) for trace in ranks for y in trace["y"])
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    bundle = driver.find_element(By.LINK_TEXT, "the signed bundle").get_attribute("href")
    assert Path(unquote(urlparse(bundle).path)).joinpath("run.json").is_file()  # back to the bundle
