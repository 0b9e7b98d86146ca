"""Benchmarks: side-by-side throughput and latency against transformers, and config-driven experiments.

:mod:`frame.bench.driver` times requests in the engine loop, :mod:`frame.bench.baseline` runs transformers'
``generate``, :mod:`frame.bench.compare` puts the two side by side, :mod:`frame.bench.experiment` runs a matrix of
engine options × workloads and :mod:`frame.bench.report` writes its results. ``frame bench serve`` lives in
:mod:`frame.bench.serve`.
"""
