"""Thin command-line layer: parse arguments, build frozen configs, call the library."""
