"""Conformance suites for plugin authors: one module per plugin kind (``frame.testing.cache``, ...).

Each module holds a pytest base class that a plugin's tests subclass, providing a factory fixture; the base
class then calls every method of the kind's contract, edge cases included. Every in-tree plugin runs its kind's
suite, and a third-party plugin should too.
"""
