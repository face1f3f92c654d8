"""The lab: what the benchmarks share, and the equipment the tests use too.

- ``bench``: running ``mlckpt run`` and reading what it left (run.json, summary.json, the records by
  op), a system description a bench run can embed, the host's load beside a figure;
- ``s3local``: a real S3-compatible store on the loopback address (OpenStack Swift's all-in-one);
- ``hostbed``: simulated hosts (network, hostname, mount, PID and clock namespaces);
- ``processes``: the live processes of one faulted run;
- ``structural``: the structural fuzzer of the checker (signed hostile bundles from real ones).

A benchmark runs as ``python benchmarks/<name>.py``, which puts this folder's parent first on the
path; the tests find it through ``pythonpath`` in ``pyproject.toml``.
"""
