"""One run's report: what a storage engineer looks at in a result folder (``mlckpt report``).

``model`` turns a bundle's documents into the report's data (pure: the ops table, each rank's
duration per op, the latency distribution per op kind, the phases, the timeline); ``page`` draws
it as one offline HTML page (plotly.js inline, no network); ``text`` prints the same tables in
the terminal and writes the ops as CSV.  Every figure comes from the records the checker
recomputes the summary from (mlckpt/metrics.py, mlckpt/latency.py).
"""
