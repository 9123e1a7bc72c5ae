"""Sphinx configuration: MyST Markdown pages, autodoc for the API, built strict and offline.

    sphinx-build -W --keep-going -b html docs docs/_build/html

(tests/docs/test_docs_build.py runs exactly that in the test suite.)
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import celery_dlq  # noqa: E402

project = "celery-dlq"
author = "celery-dlq contributors"
copyright = "2026, celery-dlq contributors"
release = version = celery_dlq.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.viewcode"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "captures/*", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4          # GitHub-style anchors: links like page.md#some-heading resolve

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options: dict = {}
autodoc_mock_imports = ["pyspark"]

html_theme = "furo"
html_title = f"celery-dlq {release}"
html_static_path: list[str] = []

# Offline: no intersphinx inventories are fetched at build time.
intersphinx_mapping: dict = {}
