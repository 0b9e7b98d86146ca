"""The worker side: one tensor-parallel rank's model, KV pool, persistent batch, sampler, speculation, graphs,
drafting and calibration. It runs in the engine process (one rank), a worker process or a Ray actor."""
