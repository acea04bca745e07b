"""servelens.gateway."""
