"""The abstract base of each plugin kind, with the result types its methods return.

One module per kind: ``platform``, ``attention``, ``cache``, ``scheduler``, ``model``. A plugin's hook returns an
instance of its kind's base class; the core calls only the methods declared here.
"""
