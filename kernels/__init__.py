"""Per-chunk mathematics in plain NumPy/SciPy (no Dask import here: each kernel runs on arrays in memory)."""
