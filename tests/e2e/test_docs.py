"""The documentation cannot drift from the code: the reference pages are what docs/gen_ref.py makes
of the code today, the site builds with every warning an error (links and anchors checked), a
reader in headless Chromium sees its navigation, and the README stays short and points only at
pages that exist."""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from support import paths
from support.browser import chromium, missing

from mlckpt.plan.aliases import RULE_SETS

ROOT = paths.REPO
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent


@pytest.mark.parametrize("xdg", [None, "/tmp/elsewhere/.config"])
def test_the_generated_reference_pages_are_current(xdg: str | None) -> None:
    """Whatever the generating user's config folder (a default path in a command's help)."""
    env = {k: v for k, v in os.environ.items() if k != "XDG_CONFIG_HOME"}
    if xdg:
        env["XDG_CONFIG_HOME"] = xdg
    proc = subprocess.run([sys.executable, str(DOCS / "gen_ref.py"), "--check"], text=True,
                          capture_output=True, check=False, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr


def check_copy(tmp_path: Path, name: str, old: str, new: str) -> subprocess.CompletedProcess[str]:
    """``gen_ref.py --check`` on a copy of the docs folder with one file altered."""
    copy = tmp_path / "docs"
    shutil.copytree(DOCS, copy)
    target = copy / name
    target.write_text(target.read_text().replace(old, new, 1))
    return subprocess.run([sys.executable, str(DOCS / "gen_ref.py"), "--check", "--docs", str(copy)],
                          text=True, capture_output=True, check=False, timeout=300, cwd=ROOT)


def test_a_stale_reference_page_is_caught(tmp_path: Path) -> None:
    proc = check_copy(tmp_path, "src/reference/generated/formats.md", "version **", "version **0")
    assert proc.returncode == 1 and "docs/src/reference/generated/formats.md" in proc.stderr


def test_every_configuration_key_and_rule_is_in_the_reference() -> None:
    from mlckpt.rules import load_rules
    from mlckpt.rules.engine import DEFAULT_RULES_VERSION

    config = (DOCS / "src" / "reference" / "generated" / "config.md").read_text()
    rows = [ln for ln in config.splitlines() if ln.startswith("| `")]
    assert len(rows) > 40
    assert not [r for r in rows if r.rstrip().endswith("|  |")], "a key without its meaning in config.yaml"
    for key in ("checkpoint.folder", "io.block_size", "witness.url", "storage.s3.endpoint"):
        assert f"| `{key}` |" in config
    rules = (DOCS / "src" / "reference" / "generated" / "rules.md").read_text()
    findings = (DOCS / "src" / "reference" / "generated" / "findings.md").read_text()
    mlperf = load_rules(RULE_SETS["mlperf-storage-v3.0"])
    for rule in (*load_rules(DEFAULT_RULES_VERSION).rules, *mlperf.rules):
        assert f"| `{rule.id}` |" in rules
        row = next(ln for ln in findings.splitlines() if ln.startswith(f"| `{rule.id}` |"))
        cause, remedy = row.split(" | ")[2:4]
        assert len(cause) > 15 and len(remedy) > 15, row  # each finding: its usual cause, what to do


def test_the_mlperf_map_has_a_failing_test_for_every_rule() -> None:
    page = (DOCS / "src" / "reference" / "generated" / "mlperf.md").read_text()
    rows = [ln for ln in page.splitlines() if ln.startswith("| ") and "`" in ln]
    assert len(rows) >= 14 and all(ln.rstrip().endswith("| yes |") for ln in rows), rows


def test_a_rule_without_its_cause_and_remedy_stops_the_generator(tmp_path: Path) -> None:
    proc = check_copy(tmp_path, "findings.yaml", "COLD-READ:", "COLD-READS:")
    assert proc.returncode != 0 and "no entry for COLD-READ" in proc.stderr
    assert "no such rule: COLD-READS" in proc.stderr


def test_the_site_builds_strictly_and_shows_its_navigation(tmp_path: Path) -> None:
    site = tmp_path / "site"
    proc = subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "-f", str(DOCS / "mkdocs.yml"),
                           "-d", str(site)], text=True, capture_output=True, check=False, timeout=600,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(BIN) + ":/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for page in ("index.html", "run/first-run/index.html", "reference/generated/rules/index.html",
                 "troubleshooting/index.html", "measurements/index.html"):
        assert (site / page).is_file(), page
    if missing():
        pytest.skip(missing() or "")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        _look(base, tmp_path)
    finally:
        server.shutdown()
    assert (tmp_path / "docs-home.png").stat().st_size > 10_000


def _look(base: str, tmp_path: Path) -> None:
    """The site as a reader sees it, served over HTTP as it would be."""
    with chromium() as d:
        d.get(f"{base}/index.html")
        nav = d.execute_script(
            "return [...document.querySelectorAll('nav.md-nav--primary > ul > li > label, "
            "nav.md-nav--primary > ul > li > a')].map(e => e.textContent.trim())")
        d.save_screenshot(str(tmp_path / "docs-home.png"))
        assert {"Run", "Submit", "Check and publish", "Troubleshooting", "Reference"} <= set(nav), nav
        assert d.title.startswith("mlckpt")
        d.get(f"{base}/run/first-run/")
        text = d.find_element("tag name", "article").text
        assert "pip install '.[mpich]'" in text and "mlckpt run" in text
        errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors  # nothing fetched from elsewhere, no script failed
        _config_page_reads_cleanly(d, base, tmp_path)


def _config_page_reads_cleanly(d: Any, base: str, tmp_path: Path) -> None:
    """The generated configuration page as a reader sees it: no path that lost its <v>, no raw
    interpolation among the defaults, and no key name broken across lines."""
    d.set_window_size(1000, 900)  # a laptop's narrow window, where long keys used to wrap
    d.get(f"{base}/reference/generated/config/")
    text = d.find_element("tag name", "article").text
    assert "rules/<v>/" in text and "rules//" not in text
    assert "${" not in text and "the workload's closed_ranks" in text
    broken = d.execute_script(
        "return [...document.querySelectorAll('article table td:first-child code')]"
        ".filter(c => c.getClientRects().length > 1).map(c => c.textContent)")
    d.save_screenshot(str(tmp_path / "docs-config.png"))
    assert not broken, broken  # each key on one line


def test_the_readme_is_short_and_links_only_to_what_exists() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links and all((ROOT / link).exists() for link in links if not link.startswith("http")), links
    # the two commands of the quick start, as CI runs the second
    assert "python3 -m venv .venv && .venv/bin/pip install '.[mpich]' && .venv/bin/mlckpt run" in text
    ci = (ROOT / ".ci" / "run").read_text()
    command = ci.split("# --- the README's test command (keep identical) ---\n", 1)[1].strip().splitlines()[0]
    assert command in text


def test_no_history_in_the_code() -> None:
    """Issue numbers and the design notes' section numbers belong in the changelog, not the code."""
    pattern = re.compile("issue " + r"[0-9]|SPEC " + "§")
    hits = [f"{p.relative_to(ROOT)}:{i}" for top in ("mlckpt", "checker", "tests")
            for p in (ROOT / top).rglob("*.py") for i, line in enumerate(p.read_text().splitlines(), 1)
            if pattern.search(line)]
    assert not hits, hits
