"""Reports: the per-bucket table from results files, /metrics scrapes and Prometheus servers."""
