"""Sphinx configuration: MyST markdown pages, sphinx-book-theme, the API reference from the
docstrings (autodoc + napoleon, Google style), cross-references to jax and flax through
inventories kept in docs/_inventories (nothing is fetched at build time).

Build: `sphinx-build -W -b html docs docs/_build/html` (warnings are errors; the tests run
exactly this). Open docs/_build/html/index.html from disk, or serve that folder:
`python -m http.server -d docs/_build/html`.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "_ext"))

project = "mxjax"
author = "the mxjax authors"
copyright = "the mxjax authors"  # noqa: A001 - Sphinx's name

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "api_members",
    "grouped_fields",
    "short_names",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "_inventories", "README.md"]
suppress_warnings = ["myst.header"]  # a page may start below level 1 (none does today)

# MyST: GitHub-style anchors for the pages' `page.md#a-heading` links.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# Docstrings: Google style; `name` in a docstring is a cross-reference where one exists.
default_role = "py:obj"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True        # Attributes: one field row per name, no duplicate targets
napoleon_use_rtype = False
autodoc_typehints = "none"      # the docstrings give shapes and dtypes
autodoc_member_order = "bysource"
autodoc_class_signature = "mixed"
autoclass_content = "class"
add_module_names = True

# jax and flax objects, from inventories committed in docs/_inventories (made by
# docs/_inventories/make.py from the projects' docs sources at the commits in
# docs/_inventories/SOURCES): nothing is downloaded at build time.
intersphinx_mapping = {
    "jax": ("https://docs.jax.dev/en/latest/", os.path.join(HERE, "_inventories", "jax.inv")),
    "flax": ("https://flax.readthedocs.io/en/latest/",
             os.path.join(HERE, "_inventories", "flax.inv")),
    "flax_linen": ("https://flax-linen.readthedocs.io/en/latest/",
                   os.path.join(HERE, "_inventories", "flax_linen.inv")),
}
intersphinx_disabled_reftypes = ["std:doc"]
intersphinx_timeout = 1

html_theme = "sphinx_book_theme"
html_title = "mxjax"
html_theme_options = {
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "use_download_button": False,
    "use_fullscreen_button": False,
}
html_static_path = []
html_show_sourcelink = False
