"""Per-chunk mathematics in plain NumPy/SciPy (SPEC 2: no Dask import here)."""
