"""servelens.report: the per-bucket table (and p95 TTFT over time) from wherever the figures are.

- :mod:`servelens.report.sources`: the three sources behind ``servelens report``: a bench results
  file (exact percentiles), a ``/metrics`` scrape or two (``histogram_quantile`` over their
  difference), a Prometheus-compatible HTTP API (the dashboard's per-bucket queries); each gives a
  :class:`~servelens.report.sources.Report`. The latency-change decomposition (coming) reads its
  windows here; its math goes in :mod:`servelens.core`.
- :mod:`servelens.report.results`: a results file's requests with their wall-clock send times.
- :mod:`servelens.report.promapi`: a small client of the Prometheus HTTP API.
- :mod:`servelens.report.html`: the self-contained HTML report (plotly).
- :mod:`servelens.report.capacity_report` and :mod:`servelens.report.capacity_output`: ``report
  --capacity`` (where the capacity is short) from each source, and its text, Markdown and JSON.

The file and text formats it reads and the table it renders are :mod:`servelens.formats`, shared
with the bench. Imports: :mod:`servelens.core`, :mod:`servelens.prometheus`,
:mod:`servelens.formats`, :mod:`servelens.dashboards` (the PromQL it shares with the dashboard);
never the bench, the sim, the gateway or ``cli`` (tests/test_layering.py).
"""
