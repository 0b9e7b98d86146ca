"""The abstract base of each plugin kind, with the result types its methods return.

One module per kind of :data:`frame.plugins.kinds.KINDS` (``platform``, ``attention``, ``cache``, ``scheduler``,
``model``, ``proposer``, ``grammar``, ``tool_parser``, ``router``, ``quantization``, ``workload``), plus
``kv_layout``. A plugin's hook returns instances of its kind's base class; the core calls only what is declared
here.
"""
