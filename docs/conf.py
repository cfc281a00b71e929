"""Sphinx configuration: the guides (MyST markdown) and the API reference (autodoc)."""

import pathlib
import sys

from sphinx.util import logging

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

project = 'jaxformer'
author = 'The jaxformer authors'
copyright = '2026, The jaxformer authors'
release = version = '0.1.0'

extensions = ['myst_parser', 'sphinx.ext.autodoc', 'sphinx.ext.napoleon', 'sphinx.ext.viewcode']
source_suffix = {'.md': 'markdown'}
exclude_patterns = ['_build', 'bench']
myst_heading_anchors = 3
default_role = 'code'  # `name` in a docstring is code, as in the guides
autodoc_default_options = {'members': True, 'undoc-members': True}
autodoc_member_order = 'bysource'
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = 'furo'
html_title = 'jaxformer'

_log = logging.getLogger(__name__)


def _require_docstrings(app, what, name, obj, options, lines):
  """A public name without a docstring is a warning, which `make docs` (-W) makes an error."""
  own = (getattr(obj, '__module__', None) or 'jaxformer').startswith('jaxformer')
  public = not name.rsplit('.', 1)[-1].startswith('_')
  if own and public and not any(line.strip() for line in lines):
    _log.warning('%s %s has no docstring', what, name, type='jaxformer', subtype='docstring')


def setup(app):
  app.connect('autodoc-process-docstring', _require_docstrings)
