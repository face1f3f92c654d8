"""Leaderboard output: Markdown (tabulate), CSV (pandas), JSON, and one self-contained HTML page.

Every format shows the same numbers: :func:`checker.leaderboard.fmt` prints each column with its
fixed decimals and the JSON carries exactly those rounded values.  Output is a pure function of
the leaderboard (no timestamps, no random IDs, stable ordering), so identical trees give
byte-identical files.

The HTML page works offline and from ``file://``: the CSS and the sorting script
(``checker/leaderboard/assets/``) and plotly.js are inlined; nothing is fetched.  Charts are drawn by
plotly.js, taken from the ``plotly`` Python package (``plotly.offline.get_plotlyjs()``, the
bundle that ``include_plotlyjs=True`` inlines).  Why plotly: it ships its JavaScript inside the
wheel, so an offline page needs nothing but ``pip``; it is widely used and maintained; it draws
SVG (prints sharply, testable in a browser) with hover details, legend toggling and PNG export.
The price is page size (about 5 MB, most of it plotly.js), paid once per page, however many
charts.  Vega-Lite would need three separate JavaScript bundles that no PyPI package ships in
plain form.  Figures are plain JSON specs written here (validated against plotly's schema with
``plotly.graph_objects.Figure`` before use) and drawn by ``Plotly.newPlot`` in the page, so the
page does not depend on how a plotly.py version serialises figures.
"""

from __future__ import annotations

import html
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd
from tabulate import tabulate

from checker.leaderboard.charts import figures, plotly_bundle, validate_figures
from checker.leaderboard.columns import (
    COLUMN,
    COLUMNS,
    RESUME_COLUMNS,
    SERVING_COLUMNS,
    SORT_NOTE,
    Column,
    fmt,
    rounded,
)
from checker.leaderboard.model import LEADERBOARD_FORMAT, RESUME, SERVING
from checker.leaderboard.systems import MLPERF_COLUMNS, SUT_FIELDS, mlperf_row
from checker.leaderboard.tables import ClassTable, Leaderboard

ASSETS = Path(__file__).parent / "assets"
DIVISION_TITLE = {"closed": "Closed division", "open": "Open division"}
CLASSES_NOTE = ("A class is division × workload × scale (full, or scaled down by one factor in the open "
                "division) × "
                "checkpoint mode (sync; or, in the open division, async and/or tiered; or serving: replicas "
                "loading the model's weights, every loading strategy in one table; or resume: a job "
                "resuming from a checkpoint written at another layout, every pair of layouts in one "
                "table). Results are "
                "ranked only within their class: a closed full-scale result never shares a table with "
                "a scaled or an open one, nor an asynchronous or tiered result with a synchronous one.")
ID_NOTE = ("Result IDs are derived from organisation, system, workload and run id (a hash, in "
           "base32): they never change between builds and adding a result never renumbers others.")


def render(board: Leaderboard, fmt_name: str, *, links: Mapping[str, str] | None = None,
           plotly_js: str | None = None, reports: Mapping[str, str] | None = None) -> str:
    if fmt_name == "md":
        return render_md(board)
    if fmt_name == "csv":
        return render_csv(board)
    if fmt_name == "json":
        return render_json(board)
    if fmt_name == "html":
        return render_html(board, links=links, plotly_js=plotly_js, reports=reports)
    raise ValueError(f"unknown format {fmt_name!r}")


def _intro(board: Leaderboard) -> str:
    n, orgs, k, pub = board.results, len(board.organisations), len(board.tables), board.published
    published = (f" Beside them, {pub} result{'s' if pub != 1 else ''} published elsewhere (DLIO / "
                 "mlpstorage), quoted UNVERIFIED below the checked results of their class." if pub else "")
    if not n:
        return "No result passes the checker yet." + published
    versions = ", ".join(board.rules_versions) or "?"
    return (f"{n} result{'s' if n != 1 else ''} from {orgs} organisation{'s' if orgs != 1 else ''} "
            f"that pass `mlckpt-check` (rules {versions}), in {k} class{'es' if k != 1 else ''}." + published)


def _excluded_why(x: Any) -> str:
    return ", ".join(x.rules) if x.rules else x.reason or "no details"


# ----------------------------------------------------------------------------------------------
# Markdown


def _md_cell(text: str) -> str:
    """Submitted text as inert Markdown: no table breaks, no inline HTML."""
    text = html.escape(text, quote=False).replace("\\", "\\\\").replace("|", "\\|")
    return " ".join(text.split())


def _md_table(table: ClassTable) -> str:
    cols = table.columns
    rows = [[_md_cell(fmt(rec[c.key], c)) for c in cols] for rec in table.frame.to_dict("records")]
    return tabulate(rows, headers=[c.label for c in cols], tablefmt="pipe", disable_numparse=True,
                    colalign=["right" if c.numeric else "left" for c in cols])


def shown_columns(board: Leaderboard) -> tuple[Column, ...]:
    """Every column a table of the board shows, each once, for the notes on how to read them."""
    seen: dict[str, Column] = {c.key: c for c in COLUMNS}
    for t in board.tables:
        seen.update({c.key: c for c in t.columns if c.key not in seen})
    return tuple(seen.values())


def render_md(board: Leaderboard) -> str:
    out = ["# mlckpt leaderboard", "", _intro(board), "",
           CLASSES_NOTE + " Within a class: " + SORT_NOTE.split(";")[0] + ".", ""]
    for division, tables in board.divisions():
        out += [f"## {DIVISION_TITLE.get(division, division)}", ""]
        for t in tables:
            n = len(t.entries)
            note = t.sort_note.split(";")[0]
            note = f" {note[0].upper()}{note[1:]}." if t.sort_note != SORT_NOTE else ""
            out += [f"### {t.key.title}", "", f"{n} result{'s' if n != 1 else ''}.{note}", "", _md_table(t),
                    ""]
    if board.excluded:
        n = len(board.excluded)
        out += ["## Excluded", "", f"{n} bundle{'s' if n != 1 else ''} {'are' if n != 1 else 'is'} not "
                "listed: failed the checker, or one invocation of a split result whose other is missing:", ""]
        out += [f"- `{x.path}`: {x.verdict} ({_md_cell(_excluded_why(x))})" for x in board.excluded]
        out.append("")
    out += ["## How to read these tables", ""]
    out += [f"- **{c.label}**: {c.help}." for c in shown_columns(board) if c.help]
    out += [f"- {ID_NOTE}", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# CSV


CSV_LEAD = ("Class", "Workload", "Scale")
# mlckpt's own columns after MLPerf's, less those MLPerf's already name (headers stay unique)
OWN_CSV_COLUMNS = tuple(c for c in COLUMNS if c.label not in MLPERF_COLUMNS)


def render_csv(board: Leaderboard) -> str:
    """MLPerf Storage's results-table columns first (their order and spelling, blank where mlckpt
    has no data), then mlckpt's own."""
    records = []
    for t in board.tables:
        for entry, rec in zip(t.entries, t.frame.to_dict("records"), strict=True):
            if entry.serving is not None or entry.resume is not None:  # no MLPerf column holds their figures
                records.append({"Class": t.key.id, "Workload": t.key.workload,
                                "Scale": "full" if t.key.scale == "full" else f"{t.key.factor:g}",
                                **{c.label: fmt(rec[c.key], c, missing="") for c in t.columns},
                                "Bundle": rec["bundle"]})
                continue
            row = mlperf_row(entry, rec, lambda v, key: fmt(v, COLUMN[key], missing=""))
            row.update({"Class": t.key.id, "Workload": t.key.workload,
                        "Scale": "full" if t.key.scale == "full" else f"{t.key.factor:g}"})
            row.update({c.label: fmt(rec[c.key], c, missing="") for c in OWN_CSV_COLUMNS})
            row["Bundle"] = rec["bundle"]
            records.append(row)
    # a serving or resume class's own columns, after the others
    present = {t.key.pipeline for t in board.tables}
    own = ((SERVING_COLUMNS, SERVING), (RESUME_COLUMNS, RESUME))
    kinds = list(dict.fromkeys(c.label for cols, kind in own if kind in present
                               for c in cols if c.label not in MLPERF_COLUMNS and c not in OWN_CSV_COLUMNS))
    frame = pd.DataFrame(records, columns=[*MLPERF_COLUMNS, *CSV_LEAD, *(c.label for c in OWN_CSV_COLUMNS),
                                           *kinds, "Bundle"],
                         dtype=object)
    buf = io.StringIO()
    frame.to_csv(buf, index=False, lineterminator="\n")
    return buf.getvalue()


# ----------------------------------------------------------------------------------------------
# JSON


def board_dict(board: Leaderboard) -> dict[str, object]:
    return {
        "leaderboard_format": LEADERBOARD_FORMAT,
        "rules_versions": list(board.rules_versions),
        "classes_note": CLASSES_NOTE,
        "sort": SORT_NOTE.split(";")[0],
        "columns": [{"key": c.key, "label": c.label, "name": c.name, "unit": c.unit or None,
                     "kind": c.kind, "decimals": c.decimals if c.kind == "num" else None,
                     "help": c.help or None} for c in shown_columns(board)],
        "classes": [{
            "id": t.key.id, "division": t.key.division, "workload": t.key.workload,
            "scale": t.key.scale, "scale_factor": t.key.factor, "pipeline": t.key.pipeline,
            "title": t.key.title, "sort": t.sort_note.split(";")[0],
            "rows": [{**{c.key: rounded(rec[c.key], c) for c in t.columns}, "bundle": rec["bundle"],
                      "verified": bool(rec["verified"])} for rec in t.frame.to_dict("records")],
        } for t in board.tables],
        "excluded": [{"path": x.path, "verdict": x.verdict, "rules": list(x.rules),
                      "reason": x.reason or None} for x in board.excluded],
    }


def render_json(board: Leaderboard) -> str:
    return json.dumps(board_dict(board), indent=1, ensure_ascii=False, allow_nan=False) + "\n"


# ----------------------------------------------------------------------------------------------
# HTML


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _script_json(obj: object) -> str:
    """JSON safe inside <script>: no '<', '>' or '&' left to end the element."""
    text = json.dumps(obj, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _script_text(js: str) -> str:
    return js.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")


def _th(c: Column, sorted_as: str = "none") -> str:
    arrow = '<span class="arrow" aria-hidden="true"></span>'
    if c.unit:
        label = f'<span class="name">{_e(c.name)}</span><span class="unit">{_e(c.unit)}{arrow}</span>'
    else:
        label = f'<span class="name">{_e(c.name)}{arrow}</span>'
    cls = "num" if c.numeric else "text"
    title = f' title="{_e(c.help)}"' if c.help else ""
    return (f'<th scope="col" class="{cls}" data-key="{c.key}" data-type="{"num" if c.numeric else "text"}" '
            f'aria-sort="{sorted_as}"{title}><button type="button">'
            f'{label}</button></th>')


BAR_COLUMNS = {"write_gib_s": "w", "read_gib_s": "r"}


def _td(rec: Mapping[str, Any], c: Column, link: str | None, maxima: Mapping[str, float],
        sut: Sequence[tuple[str, str]] = (), report: str | None = None) -> str:
    value = rec[c.key]
    text = fmt(value, c)
    missing = text == "—"
    if c.numeric:
        raw = "" if missing else repr(float(value)) if c.kind == "num" else str(int(value))
    else:
        raw = "" if missing else str(value)
    attrs = f' data-value="{_e(raw)}"'
    classes = ["num" if c.numeric else "text", f"col-{c.key}"]
    if missing:
        classes.append("missing")
    if c.key in BAR_COLUMNS and not missing and maxima.get(c.key):
        classes.append(f"bar bar-{BAR_COLUMNS[c.key]}")
        attrs += f' style="--bar:{float(value) / maxima[c.key]:.4f}"'
    body = _e(text)
    if c.key == "result_id" and link is not None:
        href = _e(quote(link, safe="/.-_~"))
        body = f'<a href="{href}" title="open the bundle: {_e(rec["bundle"])}">{body}</a>'
    if c.key == "result_id" and report is not None:  # the run's own page (mlckpt report)
        body += f' <a class="run-report" href="{_e(quote(report, safe="/.-_~"))}">report</a>'
    if c.key == "system" and sut:  # the system under test, from its description, one click away
        labels = {key: label for key, label, _ in SUT_FIELDS}
        facts = "".join(f"<dt>{_e(labels[k])}</dt><dd>{_e(v)}</dd>" for k, v in sut)
        body = f'<details class="sut"><summary>{body}</summary><dl>{facts}</dl></details>'
    return f'<td class="{" ".join(classes)}"{attrs}>{body}</td>'


# Columns the page's tables leave to their class's heading (every row of a class shares the division),
# so a table fits a laptop's window without scrolling sideways; the other formats keep them.
PAGE_OMITS = ("division",)


def _table_html(table: ClassTable, links: Mapping[str, str], reports: Mapping[str, str]) -> str:
    recs = table.frame.to_dict("records")
    columns = [c for c in table.columns if c.key not in PAGE_OMITS]
    maxima = {k: float(table.frame[k].max()) for k in BAR_COLUMNS
              if k in table.frame and table.frame[k].notna().any()}
    ranked, direction = {SERVING: ("ready_s", "ascending"), RESUME: ("resume_s", "ascending")}.get(
        table.key.pipeline, ("write_gib_s", "descending"))
    head = "".join(_th(c, direction if c.key == ranked else "none") for c in columns)
    rows = []
    for i, (entry, rec) in enumerate(zip(table.entries, recs, strict=True)):
        report = reports.get(rec["bundle"])
        cells = "".join(_td(rec, c, links.get(rec["bundle"]), maxima, entry.sut, report) for c in columns)
        rows.append(f'<tr data-order="{i}" data-id="{_e(rec["result_id"])}">{cells}</tr>')
    caption = (f'<caption>{_e(table.key.describe())}: {len(recs)} result{"s" if len(recs) != 1 else ""}, '
               f'{_e(table.sort_note)}.</caption>')
    body = "\n".join(rows)
    cid = _e(table.key.id)
    return (f'<div class="table-wrap"><table class="lb" id="table-{cid}" data-class="{cid}">{caption}'
            f'<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody></table></div>')


def _class_html(table: ClassTable, links: Mapping[str, str], figs: Mapping[str, object],
                reports: Mapping[str, str]) -> str:
    n = len(table.entries)
    badge = table.key.scale_label
    pipeline = ("" if table.key.pipeline == "sync" else
                f'<span class="badge badge-pipeline" title="checkpoint mode">{_e(table.key.pipeline)}</span>')
    charts = []
    figs_of = [k for k in ("bars", "scaling") if f"chart-{k}-{table.key.id}" in figs]
    for kind, caption in (("bars", "Bars: mean over the checkpoint writes / restores of each result; "
                                   "whiskers: the slowest and fastest op."),
                          ("scaling", "Each point: the mean over that system's results at that rank "
                                      "count; solid: write, dotted: read.")):
        cid = f"chart-{kind}-{table.key.id}"
        # A lone bar chart of few results need not span the page (bars would be slabs).
        lone = kind == "bars" and len(figs_of) == 1
        width = f' style="max-width:{max(480, 200 + 110 * n)}px"' if lone else ""
        if cid in figs:
            charts.append(f'<figure class="chart chart-{kind}"{width}><div class="plot" id="{_e(cid)}" '
                          f'role="img" aria-label="{_e(kind)} chart, {_e(table.key.describe())}"></div>'
                          f'<figcaption>{_e(caption)}</figcaption></figure>')
    return (f'<section class="lb-class" id="{_e(table.key.id)}" aria-labelledby="h-{_e(table.key.id)}">\n'
            f'<h3 id="h-{_e(table.key.id)}"><span class="workload">{_e(table.key.workload)}</span>'
            f'<span class="badge badge-{_e(table.key.scale)}">{badge}</span>'
            f'{pipeline}'
            f'<span class="badge badge-{_e(table.key.division)}">{_e(table.key.division)}</span>'
            f'<span class="count">{n} result{"s" if n != 1 else ""}</span></h3>\n'
            f'{_table_html(table, links, reports)}\n'
            f'<div class="charts charts-{len(charts)}">{"".join(charts)}</div>\n</section>')


def _nav(board: Leaderboard) -> str:
    if not board.tables:
        return ""
    parts = []
    for division, tables in board.divisions():
        items = "".join(f'<li><a href="#{_e(t.key.id)}">{_e(t.key.title)}</a> '
                        f'<span class="n">{len(t.entries)}</span></li>' for t in tables)
        title = _e(DIVISION_TITLE.get(division, division))
        parts.append(f'<div class="nav-division"><h2 class="nav-title">{title}</h2><ul>{items}</ul></div>')
    return f'<nav aria-label="classes">{"".join(parts)}</nav>'


def _excluded_html(board: Leaderboard) -> str:
    if not board.excluded:
        return ""
    rows = "".join(f'<tr><td class="text"><code>{_e(x.path)}</code></td><td class="text">{_e(x.verdict)}</td>'
                   f'<td class="text">{_e(", ".join(x.rules) or x.reason or "—")}</td></tr>'
                   for x in board.excluded)
    n = len(board.excluded)
    return (f'<section id="excluded"><h2>Excluded</h2><p>{n} bundle{"s" if n != 1 else ""} '
            f'{"are" if n != 1 else "is"} not listed: failed the checker (run <code>mlckpt-check ROOT</code> '
            f'for the findings), or one invocation of a split result whose other is missing.</p>'
            f'<div class="table-wrap"><table class="plain"><thead><tr>'
            f'<th scope="col">Bundle</th><th scope="col">Verdict</th><th scope="col">Rules</th></tr></thead>'
            f'<tbody>{rows}</tbody></table></div></section>')


def _notes_html(board: Leaderboard) -> str:
    items = "".join(f"<dt>{_e(c.label)}</dt><dd>{_e(c.help)}.</dd>" for c in shown_columns(board) if c.help)
    return (f'<section id="notes"><h2>How to read these tables</h2><p>{_e(CLASSES_NOTE)} Within a class, '
            f'results are {_e(SORT_NOTE)} (numbers: highest first; click again to reverse). '
            f'{_e(ID_NOTE)} Each result ID links to its signed bundle.</p><dl>{items}</dl></section>')


def _asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def render_html(board: Leaderboard, *, links: Mapping[str, str] | None = None,
                plotly_js: str | None = None, reports: Mapping[str, str] | None = None) -> str:
    """The page.  ``links``: bundle path (as in the tree) -> href; ``plotly_js``: the plotly.js
    source to inline (default: the installed plotly package's; tests pass a stub); ``reports``:
    bundle path -> href of the run's own page (mlckpt report), linked beside its result id."""
    links = links or {}
    figs = figures(board)
    validate_figures(figs)
    js = plotly_bundle() if plotly_js is None else plotly_js
    sections = []
    for division, tables in board.divisions():
        inner = "\n".join(_class_html(t, links, figs, reports or {}) for t in tables)
        sections.append(f'<section class="division" id="division-{_e(division)}">\n'
                        f'<h2>{_e(DIVISION_TITLE.get(division, division))}</h2>\n{inner}\n</section>')
    if not sections:
        sections.append('<p class="empty">No result passes the checker yet.</p>')
    intro = _e(_intro(board)).replace("`mlckpt-check`", "<code>mlckpt-check</code>")
    body = "\n".join(sections)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="mlckpt-check leaderboard (format {LEADERBOARD_FORMAT})">
<title>mlckpt leaderboard</title>
<style>
{_asset("leaderboard.css")}
</style>
</head>
<body>
<header class="page-header">
<div class="inner">
<h1>mlckpt leaderboard <span class="sub">LLM checkpoint storage</span></h1>
<p class="lede">{intro}</p>
<p class="classes-note">{_e(CLASSES_NOTE)}</p>
{_nav(board)}
</div>
</header>
<main>
{body}
{_excluded_html(board)}
{_notes_html(board)}
</main>
<footer><p>Generated by <code>mlckpt-check leaderboard</code> from signed bundles the checker validated.
This page is self-contained (styles, scripts and plotly.js inline) and makes no network requests.</p></footer>
<script type="application/json" id="lb-figures">{_script_json(figs)}</script>
<script>
{_script_text(js)}
</script>
<script>
{_script_text(_asset("leaderboard.js"))}
</script>
</body>
</html>
"""
