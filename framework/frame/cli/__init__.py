"""The ``frame`` command line: one module per command, wired in ``main``."""
