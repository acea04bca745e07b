"""Helpers for tests: real Prometheus/VictoriaMetrics servers (:mod:`servelens.testing.tsdb`) and a
metrics exporter fed with synthetic requests (:mod:`servelens.testing.exporter`)."""
