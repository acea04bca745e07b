"""Thin command-line layer: parse arguments, build frozen configs, call the library.

One module per subcommand (``servelens <name>`` is :mod:`servelens.cli.<name>`, registered by
:mod:`.main`); each turns bad input into one readable line (exit status 2), never a traceback.

May import: everything in servelens; nothing imports ``cli`` but ``servelens.__main__``.
"""
