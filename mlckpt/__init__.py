"""mlckpt: LLM checkpoint storage benchmark.

Pure logic (workload, sizing, rules, metrics, schemas) lives in modules that never touch MPI, files
or clocks; effects (engine, run, host, bundle, witness, cli) are thin layers on top of them.
"""

__version__ = "0.1.0"
