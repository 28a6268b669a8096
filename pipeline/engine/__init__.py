"""The engine: block sets on Dask, data blocks, the fit loop, run stores, checkpoints, the cluster."""
