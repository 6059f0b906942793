"""Sphinx configuration of the posenc site: ``make docs`` (or ``sphinx-build docs site``).

The scientific-Python stack: numpydoc renders the docstrings (reST roles and ``.. math::``
included), MyST reads the Markdown pages (``$...$`` math), pydata-sphinx-theme draws them,
and MathJax is served from a local copy (sphinx-mathjax-offline), so formulas render
without a network. The figures are regenerated from ``posenc.plots`` on every build.
"""

import posenc

project = "posenc"
author = "the posenc developers"
copyright = "the posenc developers"
release = version = posenc.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",
    "numpydoc",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "extrapolation/results.md", "extrapolation/lm_results.md", "extrapolation/count/results.md", "extrapolation/default/results.md"]  # included by (or a download of) extrapolation.md

myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3

autodoc_typehints = "none"
autodoc_member_order = "bysource"
# nn.Module.forward's generic docstring says nothing about ours.
autodoc_inherit_docstrings = False
numpydoc_show_class_members = False
numpydoc_xref_param_type = False

html_theme = "pydata_sphinx_theme"
html_title = "posenc"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": [],
}
# The left sidebar lists a section's pages: only the API reference has sections.
html_sidebars = {"*": []}
html_show_sourcelink = False
html_static_path = []


def _write_figures(app):
    from posenc import plots

    plots.write_all(f"{app.srcdir}/figures", progress=lambda message: None)


def setup(app):
    app.connect("builder-inited", _write_figures)
