"""The wire: every message that crosses a process, and the one codec that turns them into bytes.

msgspec structs only (no torch, never pickle): ``requests`` (what a client sends a core and gets back), ``plan``
(one step's plan and the runner's answer), ``client_core`` (client <-> engine core), ``core_worker`` (executor
<-> model workers), ``render`` (API server <-> chat-template workers), and ``codec`` (encoders and decoders).
"""
