"""servelens.report."""
