"""servelens.dashboards."""
