/* mlckpt leaderboard page: sortable tables and chart drawing.  Inlined into the page by
 * checker/leaderboard/render.py; no network access, no dependencies besides plotly.js (inlined before it).
 *
 * Sorting: a header button sorts its table by that column.  Numeric columns sort by the raw
 * value in each cell's data-value (not the rounded text), highest first on the first click;
 * text columns A→Z first.  A second click reverses.  Empty values stay last either way; ties
 * keep the published order (data-order), so sorting is stable and reversible.
 */
(function () {
  "use strict";

  function compareRows(a, b, idx, numeric, sign) {
    var va = a.cells[idx].getAttribute("data-value");
    var vb = b.cells[idx].getAttribute("data-value");
    var oa = Number(a.getAttribute("data-order"));
    var ob = Number(b.getAttribute("data-order"));
    var ma = va === null || va === "";
    var mb = vb === null || vb === "";
    if (ma || mb) {
      if (ma && mb) { return oa - ob; }
      return ma ? 1 : -1;
    }
    var c;
    if (numeric) {
      c = parseFloat(va) - parseFloat(vb);
    } else {
      va = va.toLowerCase();
      vb = vb.toLowerCase();
      c = va < vb ? -1 : (va > vb ? 1 : 0);
    }
    return c !== 0 ? sign * c : oa - ob;
  }

  function sortBy(table, th) {
    var headers = table.tHead.rows[0].cells;
    var idx = Array.prototype.indexOf.call(headers, th);
    var numeric = th.getAttribute("data-type") === "num";
    var current = th.getAttribute("aria-sort");
    var dir;
    if (current === "descending") { dir = "ascending"; }
    else if (current === "ascending") { dir = "descending"; }
    else { dir = numeric ? "descending" : "ascending"; }
    for (var i = 0; i < headers.length; i++) { headers[i].setAttribute("aria-sort", "none"); }
    th.setAttribute("aria-sort", dir);
    var sign = dir === "ascending" ? 1 : -1;
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) { return compareRows(a, b, idx, numeric, sign); });
    for (var r = 0; r < rows.length; r++) { body.appendChild(rows[r]); }
  }

  function initTables() {
    var tables = document.querySelectorAll("table.lb");
    Array.prototype.forEach.call(tables, function (table) {
      var buttons = table.tHead.querySelectorAll("th button");
      Array.prototype.forEach.call(buttons, function (button) {
        button.addEventListener("click", function () { sortBy(table, button.parentNode); });
      });
    });
  }

  function initCharts() {
    var el = document.getElementById("lb-figures");
    if (!el) { return; }
    var figures = JSON.parse(el.textContent);
    var ids = Object.keys(figures);
    if (!ids.length) { return; }
    if (typeof window.Plotly === "undefined") {
      console.error("mlckpt leaderboard: plotly.js is missing; charts not drawn");
      return;
    }
    ids.forEach(function (id) {
      var node = document.getElementById(id);
      var fig = figures[id];
      if (node) { window.Plotly.newPlot(node, fig.data, fig.layout, fig.config); }
    });
  }

  initTables();
  initCharts();
}());
