"""What tests/test_slurm.py needs around deploy/slurm: its scripts' locations and the TLS module, whether a
SLURM controller answers and whether one must, the small corpus the fits use, and the job bookkeeping the tests
look at."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np

from buffet.data.arrays import from_array
from buffet.data.synthetic import bnmf_corpus

SLURM_DIR = Path(__file__).resolve().parents[1] / "deploy" / "slurm"
START_CLUSTER = SLURM_DIR / "start_cluster.py"
SBATCH_WRAPPER = SLURM_DIR / "buffet.sbatch"
REQUIRE_SLURM = "BUFFET_REQUIRE_SLURM"  # set to 1 (as `local-slurm.sh run` does): a missing SLURM fails the tests


def deploy_module(name: str) -> ModuleType:
    """A script of deploy/slurm as a module (``cluster_tls``, ``start_cluster``), imported as the scripts
    import each other: from their folder."""
    if str(SLURM_DIR) not in sys.path:
        sys.path.insert(0, str(SLURM_DIR))
    return importlib.import_module(name)


def cluster_tls() -> ModuleType:
    return deploy_module("cluster_tls")


def slurm_missing() -> str | None:
    """Why the SLURM tests cannot run here, or None: sbatch must be on PATH and the controller must answer."""
    if shutil.which("sbatch") is None:
        return "sbatch is not on PATH (deploy/slurm/local-slurm.sh up brings up a single-node SLURM)"
    answer = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    if answer.returncode != 0 or not answer.stdout.strip():
        return "no SLURM controller answers sinfo (deploy/slurm/local-slurm.sh up starts one)"
    return None


def slurm_required() -> bool:
    """Whether the SLURM tests must fail rather than skip when no SLURM answers."""
    return os.environ.get(REQUIRE_SLURM) == "1"


def write_corpus(folder: Path) -> Path:
    """A count corpus of 300 documents in chunks of 100 rows."""
    corpus = bnmf_corpus(300, 60, 4, np.random.default_rng(11), tokens_per_doc=60)
    from_array(corpus.X, folder / "corpus.zarr", "counts", rows_per_chunk=100)
    return folder / "corpus.zarr"


def job_environment() -> dict[str, str]:
    """This environment with this interpreter's folder first on PATH, so that jobs find `python`, `dask` and
    `buffet` of the environment under test."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def queued_jobs(name: str) -> list[str]:
    """The ids of this user's pending or running jobs called ``name``."""
    out = subprocess.run(["squeue", "-h", "-u", str(os.getuid()), "-n", name, "-o", "%i"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return out.split()


def wait_until_gone(job: str, timeout: float = 120.0) -> None:
    """Until job ``job`` has left the queue."""
    deadline = time.monotonic() + timeout
    while job in subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30).stdout.split():
        assert time.monotonic() < deadline, f"job {job} still queued after {timeout:g} s"
        time.sleep(1)
