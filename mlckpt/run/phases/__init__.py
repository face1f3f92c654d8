"""The run's phases, in the order ``mlckpt.run.runner`` calls them: ``configure`` (the validated
configuration, what rank 0 loads first), ``gates`` (what every host measures before any I/O, and
the rules' verdict on it; importable without MPI), ``calibrate`` (each host's own timing),
``writes`` (each checkpoint as training sees it: stall, durability, background drains),
``reads`` (cold, verified restores), ``stalls`` (an op past its timeout), ``outcome`` (what was
measured, judged and shown) and ``publish`` (summary, run.json, the signed bundle)."""
