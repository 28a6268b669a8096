"""Data files that ship inside the package: found with ``importlib.resources``, so they are there in an
editable checkout and in a plain ``pip install`` alike.

``datasets/rolemining/`` holds the HP Labs Domino and Firewall user-permission files, ``datasets/golub/`` the
leukemia expression tables of Golub et al. (1999); the source and licence note of each are in its folder's
README.md.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from buffet.data.errors import UserError

ROLEMINING_FILES = ("domino.txt", "fire1.txt")
GOLUB_FILES = ("data_set_ALL_AML_train.csv.gz", "data_set_ALL_AML_independent.csv.gz", "actual.csv")
# Each shipped folder: the name its errors use and the files it holds.
FOLDERS = {"rolemining": ("role-mining", ROLEMINING_FILES), "golub": ("leukemia expression", GOLUB_FILES)}


def shipped_path(folder: str, name: str) -> Path:
    """The installed path of file ``name`` of the shipped data folder ``folder`` (a key of ``FOLDERS``)."""
    label, files = FOLDERS[folder]
    if name not in files:
        raise UserError(f"unknown {label} file {name!r}; the package ships {', '.join(files)}")
    path = Path(str(resources.files("buffet.data").joinpath("datasets", folder, name)))
    if not path.is_file():
        raise UserError(f"{path} is missing from this installation of buffet; reinstall the package")
    return path


def rolemining_path(name: str) -> Path:
    """The installed path of role-mining file ``name`` (one of ``ROLEMINING_FILES``)."""
    return shipped_path("rolemining", name)
