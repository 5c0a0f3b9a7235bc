"""Metrics core: HDR histograms, windows, SLOs, capacity, snapshots, merging, Prometheus.

Entry points: :class:`llmtop.metrics.aggregator.Aggregator` (events in, snapshots out),
:func:`llmtop.metrics.merge.merge_snapshots`, :func:`llmtop.metrics.prometheus.make_registry`.
"""
