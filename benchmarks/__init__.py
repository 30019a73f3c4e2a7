"""The benchmark and heads-reproduction pipelines (outside the installed package; run from the repository
root as ``python -m benchmarks.<name>``, or through the Makefile: ``make bench``, ``make bench-chat``...).

A pipeline is one module with a ``Settings`` dataclass (its budgets and paths), ``run(settings) -> summary``
(a sequence of resumable stages, each ``S.run_stage(out, name, fn)`` from :mod:`benchmarks.stages`, writing
``<out>/.stages/<name>.json``), ``format_summary(summary) -> str`` and ``main(argv)`` (argparse ->
``S.run_main`` / ``S.run_pipeline``: one ``error:`` line and exit 2 on a user error). Its recipes live in
``benchmarks/recipes/``; its tests in ``tests/benchmarks/test_<name>.py``. It imports ``medusa`` (the library)
and ``benchmarks.*``; ``medusa`` never imports ``benchmarks``.
"""
