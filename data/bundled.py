"""Data files that ship inside the package (the role-mining matrices): found with ``importlib.resources``,
so they are there in an editable checkout and in a plain ``pip install`` alike.

``datasets/rolemining/`` holds the HP Labs Domino and Firewall user-permission files; their source
and licence note are in that folder's README.md.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from buffet.data.errors import UserError

ROLEMINING_FILES = ("domino.txt", "fire1.txt")


def rolemining_path(name: str) -> Path:
    """The installed path of role-mining file ``name`` (one of ``ROLEMINING_FILES``)."""
    if name not in ROLEMINING_FILES:
        raise UserError(f"unknown role-mining file {name!r}; the package ships {', '.join(ROLEMINING_FILES)}")
    path = Path(str(resources.files("buffet.data").joinpath("datasets", "rolemining", name)))
    if not path.is_file():
        raise UserError(f"{path} is missing from this installation of buffet; reinstall the package")
    return path
