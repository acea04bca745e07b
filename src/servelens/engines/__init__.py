"""Real inference engines as test and demo targets (installed into a scratch venv on demand)."""
