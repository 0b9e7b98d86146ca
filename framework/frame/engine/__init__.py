"""The engine: the core loop (schedule, run, sample, update), the model runner, the sampler and the clients."""
