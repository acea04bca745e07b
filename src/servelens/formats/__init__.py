"""servelens.formats: the formats that measurements travel in between packages, each written and
read in one place.

- :mod:`servelens.formats.results`: the bench results file (``results.jsonl``, one
  :class:`~servelens.formats.results.BenchRecord` per request) and the ``summary.json`` beside it.
  The bench writes it; ``servelens report`` and the demo read it.
- :mod:`servelens.formats.metrics_text`: a ``/metrics`` scrape (Prometheus text) read into
  per-bucket histograms, and the difference of two scrapes. The bench scrapes the server before
  and after a run; ``servelens report --metrics`` reads saved or live scrapes.
- :mod:`servelens.formats.engine_log`: an engine's queue and prefill time per request (JSONL, the
  sim's truth log is one), joined to bench results by request id for ``report --capacity``.
- :mod:`servelens.formats.table`: the per-bucket table rendered as rich, plain text, CSV, JSON or
  Markdown, and client beside server. The bench prints it; the report prints and embeds it.

Imports: :mod:`servelens.core`, :mod:`servelens.prometheus` (metric names, exposition parsing) and
third-party libraries (msgspec, rich); never an adapter (bench, report, sim, gateway, eval) or
``cli``. So the bench, the report and the coming ``eval`` share these without importing each other
(tests/test_layering.py holds every package to its declared imports).
"""
