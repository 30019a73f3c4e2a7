"""``medusa demo``: the whole pipeline on the embedded default model (:mod:`medusa.demo.run`) and the
resumable stages it runs (:mod:`medusa.demo.stages`, reused by the benchmark pipelines in ``benchmarks/``).
Package data: the demo's recipe (``recipes/``) and the default model (``default_model``, a link to the
repository's ``data/default_model`` that the wheel build copies in)."""
