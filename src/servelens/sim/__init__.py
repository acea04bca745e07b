"""servelens.sim."""
