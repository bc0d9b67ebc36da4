"""Client-side tools, each a client of a running server: ``zinfer perf`` (``perf_cli`` with its load
generator ``perf_load`` and report ``perf_report``), ``zinfer tune`` (``tune_cli``) and ``zinfer status``
(``status_view``).

The ``zinfer`` command imports a tool only when its subcommand runs, so ``zinfer serve`` never loads them.
Import rules: a tool imports ``zinfer.client`` and the model-config layer only, never the broker or the
workers; what it shows of the server comes from the wire (``Client`` calls), not from server internals.
"""
