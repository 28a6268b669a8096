"""Sphinx configuration of buffet's documentation site.

Build it with ``.venv/bin/sphinx-build -W --keep-going -b html docs docs/_build/html`` after installing the
``docs`` extra. Pages are MyST Markdown; pages under ``tutorials/`` are notebooks in MyST form, run while the
site builds (MyST-NB), so a tutorial that stops working fails the build. Equations are typeset by a local
MathJax, so the built site needs no network when it is opened.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import buffet

# docs/_ext: this site's own extensions (the command-line reference, the estimators' parameters)
sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "buffet"
author = "the buffet developers"
copyright = "2026, the buffet developers"
release = buffet.__version__

extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax", "cli_reference",
              "estimator_params"]
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
exclude_patterns = ["_build", "jupyter_execute", "**.ipynb_checkpoints"]

nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_execution_timeout = 300
nb_merge_streams = True

autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = False

html_theme = "furo"
html_title = f"buffet {release}"
html_static_path: list[str] = []

# MathJax 2 from jupyter-server-mathjax, copied into the built site's _static folder (a relative mathjax_path
# resolves there); that copy has the "-full" configuration and the STIX-Web fonts only. MyST-NB marks page
# bodies for MathJax to skip, so the classes Sphinx gives equations are listed to be processed.
MATHJAX_DIR = "_mathjax"
mathjax_path = f"{MATHJAX_DIR}/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"
mathjax2_config = {
    "tex2jax": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]], "processClass": "math|output_area"},
    "HTML-CSS": {"availableFonts": ["STIX-Web"], "webFont": "STIX-Web", "imageFont": None},
}


def copy_mathjax(app, exception) -> None:
    """Put jupyter-server-mathjax's MathJax beside the built pages, where ``mathjax_path`` points."""
    if exception is not None or app.builder.format != "html":
        return
    import jupyter_server_mathjax

    target = Path(app.outdir) / "_static" / MATHJAX_DIR
    if not (target / "MathJax.js").exists():
        shutil.copytree(Path(jupyter_server_mathjax.__file__).parent / "static", target, dirs_exist_ok=True)


def setup(app) -> None:
    app.connect("build-finished", copy_mathjax)
