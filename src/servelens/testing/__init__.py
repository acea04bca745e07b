"""Helpers for tests: real Prometheus/VictoriaMetrics servers (:mod:`servelens.testing.tsdb`), a
metrics exporter fed with synthetic requests (:mod:`servelens.testing.exporter`), and seeded synthetic
latency windows for the latency-change analysis (:mod:`servelens.testing.latency_windows`)."""
