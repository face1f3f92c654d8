"""Check functions by stage: ``config``, ``host``, ``result``, ``submission``.  Each module ends
with its ``CHECKS`` table; ``mlckpt.rules.registry`` composes them."""
