"""Sphinx extension: the short module names a JAX user writes in a docstring (`lax.`,
`jnp.`, `nn.`, `nnx.`) cross-reference the full names in the jax and flax inventories
(`lax.dot_general` links to `jax.lax.dot_general`). A name neither inventory has stays
plain code, as any unresolved `name` does.
"""

from __future__ import annotations

import copy

from sphinx.ext import intersphinx

ALIASES = {"lax.": "jax.lax.", "jnp.": "jax.numpy.", "nn.": "flax.linen.",
           "nnx.": "flax.nnx.", "np.": "numpy."}


def _resolve(app, env, node, contnode):
  if node.get("refdomain") != "py":
    return None
  target = node.get("reftarget", "")
  for short, full in ALIASES.items():
    if target.startswith(short):
      retry = copy.copy(node)
      retry["reftarget"] = full + target[len(short):]
      return intersphinx.missing_reference(app, env, retry, contnode)
  return None


def setup(app):
  app.setup_extension("sphinx.ext.intersphinx")
  app.connect("missing-reference", _resolve, priority=600)  # after intersphinx's own try
  return {"parallel_read_safe": True, "parallel_write_safe": True}
