"""Sphinx configuration for jaxgrad's documentation site (see docs/README.md).

Build it strictly (every warning is an error), as CI does:

    sphinx-build -W --keep-going -b html docs docs/_build/html
"""

import jaxgrad

project = "jaxgrad"
author = "the jaxgrad developers"
copyright = "2026, the jaxgrad developers"
release = jaxgrad.__version__

extensions = [
    "myst_parser",  # the pages are Markdown, readable on GitHub as they are
    "sphinx.ext.autodoc",  # the API reference, from the docstrings
    "sphinx.ext.napoleon",  # which are Google style
    "sphinx.ext.mathjax",
    # Copies MathJax into _static and points mathjax_path at it: the pages load no
    # script from the network, so formulas render offline.
    "sphinx-mathjax-offline",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["README.md", "_build", "data"]
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3  # so that [text](page.md#a-heading) links resolve

autodoc_typehints = "signature"
# Show the annotations as written (jaxgrad's modules use postponed annotations), not
# as the expanded union behind ArrayLike.
autodoc_type_aliases = {"ArrayLike": "jax.typing.ArrayLike", "jax.Array": "jax.Array"}
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = f"jaxgrad {release}"
