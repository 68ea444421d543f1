"""Counting the MX products a traced function computes (did MX run at all?)."""

from __future__ import annotations

import jax


def _jaxprs(value):
  """The jaxprs held in an equation parameter (a jaxpr, a closed one, or a tuple of them
  as `cond`'s branches)."""
  if isinstance(value, jax.extend.core.ClosedJaxpr):
    yield value.jaxpr
  elif isinstance(value, jax.extend.core.Jaxpr):
    yield value
  elif isinstance(value, (tuple, list)):
    for v in value:
      yield from _jaxprs(v)


def _is_mx_product(eqn) -> bool:
  """An MX product is mxjax's block-scaled product (`mxjax._src.product._product`): a
  `custom_vjp` traced from that function (its backward's name is lost under vmap)."""
  if eqn.primitive.name != "custom_vjp_call":
    return False
  info = getattr(eqn.params["call_jaxpr"].jaxpr, "debug_info", None)
  source = getattr(info, "func_src_info", None) or ""
  return source.split(" ")[0] == "_product" or "_product_bwd" in str(eqn.params.get("bwd"))


def _count(jaxpr) -> int:
  n = 0
  for eqn in jaxpr.eqns:
    if _is_mx_product(eqn):
      n += 1
      continue  # its own quantizations are not products
    for value in eqn.params.values():
      for sub in _jaxprs(value):
        n += _count(sub)
  return n


def count_mx_products(fn, *args, **kwargs) -> int:
  """How many MX products `fn(*args, **kwargs)` computes in its forward pass, traced
  once under the enclosing contexts (autocast, intercept); nothing is computed. Trace a
  loss, not its gradient: differentiation replaces each product by its two halves."""
  return _count(jax.make_jaxpr(fn)(*args, **kwargs).jaxpr)
