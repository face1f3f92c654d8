"""mlckpt-check: validates signed result bundles and publishes leaderboard tables.

Imports mlckpt's pure parts (workload, sizing, rules, metrics, schemas) and bundle verification,
never its MPI or I/O engine.
"""
