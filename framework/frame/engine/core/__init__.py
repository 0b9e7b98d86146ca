"""The engine-core side: the loop, the scheduler, the structured-output manager and the executors that drive the
model workers. It runs in the engine process (a child of the API server, a Ray actor, or the caller's process)."""
