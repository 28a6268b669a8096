"""Datasets: Zarr storage, ingest of file formats, splits and generators."""
