"""The leaderboard's charts as plotly.js figure specs: one bar chart per class (each result's write
and read headline, with the slowest and fastest op as whiskers) and one scaling chart per class
(mean per system and rank count).  Plain JSON specs, checked against plotly's schema before use
(see checker/leaderboard/render.py for why plotly)."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

from checker.leaderboard.columns import COLUMN, rounded
from checker.leaderboard.model import RESUME, SERVING
from checker.leaderboard.tables import ClassTable, Leaderboard, scaling_series

WRITE_COLOR = "#2563eb"
READ_COLOR = "#f59e0b"
# Scaling lines: one colour per system, distinct from the write (blue) / read (amber) bars.
PALETTE = ("#0f766e", "#7c3aed", "#db2777", "#65a30d", "#0891b2", "#b45309", "#4b5563", "#dc2626",
           "#1e3a8a", "#a16207")
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"


def _r(value: object, digits: int = 3) -> float | None:
    if value is None or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return round(float(value), digits)


def _base_layout(title: str, ytitle: str) -> dict[str, Any]:
    return {
        "title": {"text": title, "x": 0, "xanchor": "left", "font": {"size": 14}},
        "font": {"family": FONT, "size": 12, "color": "#1f2937"},
        "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff",
        "margin": {"l": 64, "r": 16, "t": 56, "b": 64},
        "height": 400,
        "yaxis": {"title": {"text": ytitle}, "rangemode": "tozero", "gridcolor": "#e5e7eb",
                  "zerolinecolor": "#9ca3af", "tickformat": ",.2~f"},
        "legend": {"orientation": "h", "x": 1, "xanchor": "right", "y": 1.02, "yanchor": "bottom"},
        "hoverlabel": {"font": {"family": FONT}},
    }


def bar_figure(table: ClassTable) -> dict[str, object]:
    recs = table.frame.to_dict("records")
    ids = [r["result_id"] for r in recs]
    traces = []
    for op, color in (("write", WRITE_COLOR), ("read", READ_COLOR)):
        col = COLUMN[f"{op}_gib_s"]
        y = [rounded(r[col.key], col) for r in recs]
        hi = [_r(r[f"{op}_max_gib_s"] - r[col.key]) if y[i] is not None else None for i, r in enumerate(recs)]
        lo = [_r(r[col.key] - r[f"{op}_min_gib_s"]) if y[i] is not None else None for i, r in enumerate(recs)]
        traces.append({
            "type": "bar", "name": f"{op.title()} (mean over ops)", "x": ids, "y": y,
            "marker": {"color": color},
            "error_y": {"type": "data", "symmetric": False, "array": hi, "arrayminus": lo,
                        "color": "#374151", "thickness": 1.2, "width": 4},
            "customdata": [[r["organisation"], r["system"], int(r["ranks"])] for r in recs],
            "hovertemplate": (f"<b>%{{customdata[1]}}</b> (%{{customdata[0]}})<br>%{{x}} · "
                              f"%{{customdata[2]}} ranks<br>{op.title()}: %{{y:.2f}} GiB/s"
                              "<extra>bars: mean · whiskers: min–max over ops</extra>"),
        })
    layout = _base_layout("Write and read bandwidth per result", "GiB/s")
    if len(recs) <= 2:
        layout["height"] = 320
    # Few results: narrower bars (plotly has no maximum bar width).
    layout.update(barmode="group", bargap=round(0.3 + 0.12 * max(0, 5 - len(recs)), 2), bargroupgap=0.08)
    layout["xaxis"] = {"type": "category", "tickvals": ids, "automargin": True,
                       "ticktext": [f"{html.escape(str(r['system']), quote=True)}<br>"
                                    f"{int(r['ranks'])} ranks<br>"
                                    f"<span style='font-size:10px;color:#6b7280'>{r['result_id']}</span>"
                                    for r in recs], "tickfont": {"size": 11}}
    if len(recs) <= 8:
        layout["xaxis"]["tickangle"] = 0
    return {"data": traces, "layout": layout}


def scaling_figure(table: ClassTable) -> dict[str, object] | None:
    series = scaling_series(table)
    if not series:
        return None
    traces = []
    all_ranks: set[int] = set()
    for i, ((org, system), points) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        ranks = [p[0] for p in points]
        all_ranks.update(ranks)
        for op, y, dash, symbol in (("write", [_r(p[1], 2) for p in points], "solid", "circle"),
                                    ("read", [_r(p[2], 2) for p in points], "dot", "diamond")):
            traces.append({
                "type": "scatter", "mode": "lines+markers", "name": f"{system} · {op}", "x": ranks, "y": y,
                "legendgroup": f"{org}/{system}", "line": {"color": color, "dash": dash, "width": 2},
                "marker": {"color": color, "symbol": symbol, "size": 8},
                "customdata": [[org, p[3]] for p in points],
                "hovertemplate": (f"<b>{html.escape(system)}</b> (%{{customdata[0]}})<br>%{{x}} ranks: "
                                  f"{op} %{{y:.2f}} GiB/s<br>mean of %{{customdata[1]}} result(s)"
                                  "<extra></extra>"),
            })
    layout = _base_layout("Scaling: bandwidth vs ranks", "GiB/s")
    layout["legend"] = {"orientation": "h", "x": 0, "xanchor": "left", "y": -0.22, "yanchor": "top"}
    layout["margin"] = {**layout["margin"], "b": 40}
    ticks = sorted(all_ranks)
    layout["xaxis"] = {"type": "log", "title": {"text": "ranks (log scale)"}, "tickvals": ticks,
                       "ticktext": [str(v) for v in ticks], "gridcolor": "#f3f4f6"}
    return {"data": traces, "layout": layout}


IMAGE_OPTIONS = {"format": "png", "scale": 2}
PLOT_CONFIG = {"displaylogo": False, "responsive": True,
               "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d"],
               "toImageButtonOptions": IMAGE_OPTIONS}


def figures(board: Leaderboard) -> dict[str, dict[str, object]]:
    """Chart element id -> {data, layout, config}, in page order."""
    out: dict[str, dict[str, object]] = {}
    for t in board.tables:
        if t.key.pipeline in (SERVING, RESUME):  # its table ranks a time; no bandwidth bars
            continue
        for kind, fig in (("bars", bar_figure(t)), ("scaling", scaling_figure(t))):
            if fig is None:
                continue
            cid = f"chart-{kind}-{t.key.id}"
            out[cid] = {**fig, "config": {**PLOT_CONFIG, "toImageButtonOptions": {
                **IMAGE_OPTIONS, "filename": cid}}}
    return out


def validate_figures(figs: Mapping[str, Mapping[str, object]]) -> None:
    """Raise ValueError if a spec uses a property plotly does not know (plotly.py's schema)."""
    import plotly.graph_objects as go

    for fig in figs.values():
        go.Figure(data=fig["data"], layout=fig["layout"])


def plotly_bundle() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()
