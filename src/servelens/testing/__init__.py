"""Helpers for tests: real Prometheus/VictoriaMetrics servers (:mod:`servelens.testing.tsdb`), a
metrics exporter fed with synthetic requests (:mod:`servelens.testing.exporter`), a loopback server of
fixed bytes (:mod:`servelens.testing.static`), and seeded synthetic latency windows for the
latency-change analysis (:mod:`servelens.testing.latency_windows`). The gateway's and the sim's own
test helpers live beside them (:mod:`servelens.gateway.testing`, :mod:`servelens.sim.testing`).

May import: :mod:`servelens.core`, :mod:`servelens.prometheus`, :mod:`servelens.process`,
:mod:`servelens.report`.
"""
