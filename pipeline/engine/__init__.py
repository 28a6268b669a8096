"""The engine (SPEC 2): executors, block reads, the fit loop, run stores, checkpoints, the cluster."""
