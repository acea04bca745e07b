"""servelens.bench."""
