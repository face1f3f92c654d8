"""One run's report as one offline HTML page: facts and verdict, the op timeline, each rank's
duration per op, the latency CDF per op kind, where each op's time went, and the ops table.

plotly.js comes inline from the ``plotly`` package (as the leaderboard's page: nothing is
fetched, the page works from ``file://``).  Figures are plain JSON specs, checked against
plotly's schema before use, and drawn by ``Plotly.newPlot``: each chart's ``div`` keeps its data
(``document.getElementById("latency").data``), which is what the browser test reads back.
"""

from __future__ import annotations

import html
import json

from mlckpt.report.model import OP_COLUMNS, Report
from mlckpt.units import fmt_figure

COLORS = {"write": "#2563eb", "read": "#f59e0b"}
PHASE_COLORS = {"open": "#64748b", "transfer": "#2563eb", "fsync": "#dc2626", "dir_fsync": "#7c3aed"}
HOST_COLORS = ("#0f766e", "#7c3aed", "#db2777", "#65a30d", "#0891b2", "#b45309")
LAYOUT = {"margin": {"l": 60, "r": 20, "t": 40, "b": 50}, "height": 340,
          "font": {"family": "system-ui, sans-serif", "size": 12}, "plot_bgcolor": "#ffffff",
          "legend": {"orientation": "h", "y": -0.25}}
CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;color:#0f172a;
background:#f8fafc}header{background:#0f172a;color:#f8fafc;padding:16px 24px}
header h1{margin:0;font-size:20px}main{padding:16px 24px;max-width:1600px}
.wide{overflow-x:auto;max-width:100%}details summary{cursor:pointer;font-weight:600;margin:4px 0}
td.slowest{font-weight:700;color:#b91c1c}table.facts td{text-align:left}
section{background:#fff;border:1px solid #e2e8f0;border-radius:8px;padding:12px 16px;margin:0 0 16px}
h2{font-size:16px;margin:4px 0 8px}table{border-collapse:collapse;font-size:12px}
td,th{border-bottom:1px solid #e2e8f0;padding:3px 8px;text-align:right}th{background:#f1f5f9}
td:first-child,th:first-child{text-align:left}.verdict{font-weight:600}.note{color:#475569;font-size:12px}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def figures(rep: Report) -> dict[str, dict[str, object]]:
    figs: dict[str, dict[str, object]] = {}
    data: list[dict[str, object]] = []
    hosts = sorted({s.host for s in rep.segments})
    for n, host in enumerate(hosts):
        xs: list[float | None] = []
        ys: list[float | None] = []
        for s in (s for s in rep.segments if s.host == host):
            xs += [s.start_s, s.end_s, None]
            ys += [s.gib_s, s.gib_s, None]
        data.append({"type": "scatter", "mode": "lines", "name": f"{host}: per op", "x": xs, "y": ys,
                     "line": {"color": HOST_COLORS[n % len(HOST_COLORS)], "width": 2}})
        if host in rep.samples:
            pts = rep.samples[host]
            data.append({"type": "scatter", "mode": "lines", "name": f"{host}: device, sampled",
                         "x": [t for t, _ in pts], "y": [v for _, v in pts],
                         "line": {"color": HOST_COLORS[n % len(HOST_COLORS)], "width": 1, "dash": "dot"}})
    shapes = [{"type": "rect", "xref": "x", "yref": "paper", "x0": s.start_s, "x1": s.end_s, "y0": 0, "y1": 1,
               "fillcolor": COLORS.get(s.op, "#94a3b8"), "opacity": 0.12, "line": {"width": 0}}
              for s in rep.segments if s.host == (hosts[0] if hosts else None)]
    figs["timeline"] = {"data": data, "layout": {
        **LAYOUT, "title": {"text": "Bandwidth over the run"}, "shapes": shapes,
        "xaxis": {"title": {"text": "s since the host's first op"}},
        "yaxis": {"title": {"text": "GiB/s"}, "rangemode": "tozero"}}}
    # one box per op with every rank's point beside it, spread sideways (jitter): ranks with the
    # same time no longer sit on one dot; hovering names the rank, the table below lists them all
    figs["ranks"] = {"data": [
        {"type": "box", "name": kind, "boxpoints": "all", "jitter": 0.6, "pointpos": 0,
         "x": [r["op"] for r in rep.ranks if r["op"].startswith(kind)],
         "y": [r["duration_s"] for r in rep.ranks if r["op"].startswith(kind)],
         "text": [f"rank {r['rank']} on {r['host']}" for r in rep.ranks if r["op"].startswith(kind)],
         "hoverinfo": "y+text", "fillcolor": "rgba(0,0,0,0)", "line": {"color": COLORS[kind], "width": 1},
         "marker": {"color": COLORS[kind], "size": 6, "opacity": 0.7}}
        for kind in ("write", "read") if any(r["op"].startswith(kind) for r in rep.ranks)],
        "layout": {**LAYOUT, "title": {"text": "Each rank's time per op (the highest sets the op's)"},
                   "boxmode": "group", "yaxis": {"title": {"text": "s"}, "rangemode": "tozero"}}}
    figs["latency"] = {"data": [
        {"type": "scatter", "mode": "lines", "name": f"{kind} requests", "x": xs, "y": ys,
         "line": {"color": COLORS[kind], "shape": "hv"}}
        for kind, (xs, ys) in rep.cdfs.items()],
        "layout": {**LAYOUT, "title": {"text": "Request latency (CDF)"},
                   "xaxis": {"title": {"text": "ms"}, "type": "log"},
                   "yaxis": {"title": {"text": "fraction of requests"}, "range": [0, 1.02]}}}
    labels = [f"{o['op']} {o['index']}" for o in rep.ops]
    figs["phases"] = {"data": [
        {"type": "bar", "name": phase, "x": labels, "y": [o.get(f"{phase}_s") for o in rep.ops],
         "marker": {"color": color}}
        for phase, color in PHASE_COLORS.items() if any(o.get(f"{phase}_s") is not None for o in rep.ops)],
        "layout": {**LAYOUT, "barmode": "stack", "title": {"text": "Where the slowest rank's time went"},
                   "yaxis": {"title": {"text": "s"}}}}
    _validate(figs)
    return figs


def _validate(figs: dict[str, dict[str, object]]) -> None:
    import plotly.graph_objects as go

    for fig in figs.values():
        go.Figure(data=fig["data"], layout=fig["layout"])


def _cell(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return fmt_figure(v)  # four significant digits, never 4.726e-05
    return _e(v)


def _rank_table(rep: Report) -> str:
    """Every rank's time per op (ranks down, ops across), each op's slowest in bold: what the
    strip chart cannot show once many ranks share a time."""
    ops = list(dict.fromkeys(r["op"] for r in rep.ranks))
    if not ops:
        return ""
    by = {(r["rank"], r["op"]): r for r in rep.ranks}
    slowest = {op: max(r["duration_s"] for r in rep.ranks if r["op"] == op) for op in ops}
    ranks = sorted({(r["rank"], r["host"]) for r in rep.ranks})
    head = "<tr><th>rank</th><th>host</th>" + "".join(f"<th>{_e(op)} (s)</th>" for op in ops) + "</tr>"

    def cell(rank: int, op: str) -> str:
        r = by.get((rank, op))
        if r is None:
            return "<td></td>"
        mark = ' class="slowest"' if r["duration_s"] == slowest[op] else ""
        return f"<td{mark}>{fmt_figure(r['duration_s'])}</td>"

    rows = "".join(f"<tr><td>{rank}</td><td>{_e(host)}</td>" + "".join(cell(rank, op) for op in ops) + "</tr>"
                   for rank, host in ranks)
    return (f'<details id="per-rank"><summary>Each rank\'s time per op ({len(ranks)} ranks; the slowest '
            f'of each op in bold)</summary><div class="wide"><table id="ranks-table">{head}{rows}</table>'
            "</div></details>")


def render(rep: Report, plotly_js: str | None = None, *, plotly_src: str | None = None,
           bundle_href: str | None = None) -> str:
    """The page.  ``plotly_js``: the plotly.js source to inline (default: the installed package's);
    ``plotly_src``: instead, a relative path to a copy of it beside the page (the leaderboard's run
    pages share one); ``bundle_href``: a link to the run's bundle."""
    if plotly_js is None and plotly_src is None:
        from plotly.offline import get_plotlyjs

        plotly_js = get_plotlyjs()
    figs = figures(rep)
    facts = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rep.facts)
    findings = "".join(f"<li>{_e(f)}</li>" for f in rep.findings) or "<li>none</li>"
    head = "".join(f"<th>{_e(c)}</th>" for c in OP_COLUMNS)
    rows = "".join("<tr>" + "".join(f"<td>{_cell(o.get(c))}</td>" for c in OP_COLUMNS) + "</tr>"
                   for o in rep.ops)
    charts = "".join(f'<section><div id="{name}" class="chart"></div></section>' for name in figs)
    per_rank = _rank_table(rep)
    spec = json.dumps(figs).replace("</", "<\\/")
    inline = (plotly_js or "").replace("</script", "<\\/script")
    script = (f'<script src="{_e(plotly_src)}"></script>' if plotly_src is not None
              else "<script>" + inline + "</script>")
    link = f' <a href="{_e(bundle_href)}">the signed bundle</a>' if bundle_href else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>mlckpt report: {_e(rep.title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>
<body><header><h1>mlckpt report: {_e(rep.title)}</h1></header><main>
<section><h2>Run</h2><p class="verdict">verdict: {_e(rep.verdict)}{link}</p>
<table class="facts">{facts}</table>
<h2>Findings</h2><ul>{findings}</ul></section>
{charts}
<section><h2>Ops</h2><div class="wide"><table id="ops"><tr>{head}</tr>{rows}</table></div>
<p class="note">An op's duration is its slowest rank's (barrier to last byte, durable for writes); its
bandwidth is every rank's bytes over that duration (the aggregate), and slowest_rank_bandwidth_gib_s the
slowest rank's own bytes over its own time. Latency percentiles cover every request of every rank
(HdrHistogram, within 1 %); phases are the slowest rank's. Everything here is recomputed from records.jsonl
(docs: Reading a run's report).</p>
{per_rank}</section>
</main>
<script type="application/json" id="figures">{spec}</script>
{script}
<script>
const figs = JSON.parse(document.getElementById("figures").textContent);
for (const [id, f] of Object.entries(figs)) {{
  Plotly.newPlot(id, f.data, f.layout, {{displaylogo: false, responsive: true}});
}}
</script>
</body></html>
"""
