"""Per-cluster TLS credentials for the Dask clusters that deploy/slurm starts.

A Dask scheduler runs whatever a connecting client sends, as the user who started it, so a cluster on a
shared network must let in only its own workers and its own client. Each cluster gets a fresh CA,
certificate and key (distributed's ``Security.temporary()``) in a private folder (mode 0700, files 0600)
on the shared file system, where the worker jobs read them; the folder is deleted when the cluster ends.
The buffet command finds them through Dask's own configuration variables (``client_environment``), which
``distributed.Client`` reads.

Run as a script (the sbatch wrapper does): ``python cluster_tls.py PARENT`` makes a credentials folder
under PARENT and prints its path.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distributed.security import Security

# The files of a credentials folder; the scheduler, the workers and the client share one certificate.
CA, CERT, KEY = "ca.pem", "cert.pem", "key.pem"


@dataclass(frozen=True)
class Credentials:
    """A credentials folder: ``ca.pem``, ``cert.pem`` and ``key.pem``."""

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / CA

    @property
    def cert(self) -> Path:
        return self.folder / CERT

    @property
    def key(self) -> Path:
        return self.folder / KEY

    def security(self) -> "Security":
        """The ``Security`` of the scheduler, the workers and the client: TLS required, these files."""
        from distributed.security import Security

        files = {"tls_ca_file": str(self.ca), "tls_scheduler_cert": str(self.cert),
                 "tls_scheduler_key": str(self.key), "tls_worker_cert": str(self.cert),
                 "tls_worker_key": str(self.key), "tls_client_cert": str(self.cert),
                 "tls_client_key": str(self.key)}
        return Security(require_encryption=True, **files)

    def client_environment(self) -> dict[str, str]:
        """Dask's configuration variables that make a ``Client`` in another process use these files."""
        return {"DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
                "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(self.ca),
                "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": str(self.cert),
                "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": str(self.key)}

    def remove(self) -> None:
        """Delete the folder and its files (nothing if it is gone already)."""
        shutil.rmtree(self.folder, ignore_errors=True)


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to a new file that only its owner can read."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def make_credentials(parent: Path) -> Credentials:
    """New credentials in a new private folder under ``parent`` (created, mode 0700, if missing)."""
    from distributed.security import Security

    parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    credentials = Credentials(Path(tempfile.mkdtemp(prefix="buffet-tls-", dir=parent)))  # mode 0700
    temporary = Security.temporary()  # PEM text, not file names: one self-signed certificate is also the CA
    _write_private(credentials.ca, temporary.tls_ca_file)
    _write_private(credentials.cert, temporary.tls_client_cert)
    _write_private(credentials.key, temporary.tls_client_key)
    return credentials


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: cluster_tls.py PARENT_FOLDER  (prints the new credentials folder)")
    print(make_credentials(Path(sys.argv[1]).expanduser().resolve()).folder)
