"""Sphinx configuration of Tarantella's documentation site.

Build (from the repository root, after `pip install -e ".[docs]"`):

    sphinx-build -W -b html docs docs/_build/html

Pages are MyST Markdown, so they read the same on GitHub. Nothing is copied by
hand: the Python reference comes from the docstrings (autodoc), the `tntrun`
reference from its argument parser (sphinx-argparse), and the table of TNT_*
variables from `tarantella.common.config.markdown_table()` at build time
(docs/_ext/tnt_docs.py).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "_ext"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # autodoc imports TensorFlow

project = "Tarantella"
author = "the Tarantella authors"
copyright = "the Tarantella authors, Apache-2.0"
try:
    from importlib.metadata import version as _version

    release = _version("tarantella")
except Exception:  # a checkout that is not installed: autodoc will say so
    release = "unknown"
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
    "tnt_docs",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "_static", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4  # links such as design.md#execution-and-fusion

autodoc_member_order = "bysource"
autodoc_typehints = "description"
# only what Tarantella's own docstrings say (Keras' would bring Keras' examples along)
autodoc_inherit_docstrings = False
autodoc_default_options = {"show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# `name` in a docstring is code, as in the Markdown pages
default_role = "code"
# blocks without a language (program output) are not coloured as Python
highlight_language = "text"
# command lines stay as typed: no "--" turned into a dash, no curly quotes
smartquotes = False

# written in another branch: left out until it exists (see _ext/tnt_docs.py)
tnt_optional_pages = ["migration"]

html_theme = "alabaster"
html_title = f"Tarantella {release}"
html_static_path = ["_static"]  # custom.css, which alabaster loads
html_theme_options = {
    "description": "Data-parallel training for TensorFlow 2 / Keras 3 by changing one or two lines",
    "fixed_sidebar": True,
    "page_width": "1200px",
    "body_max_width": "none",
    "show_relbars": True,
}
html_sidebars = {"**": ["about.html", "searchfield.html", "navigation.html", "relations.html"]}
html_show_sourcelink = False
