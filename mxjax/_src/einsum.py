"""Block-scaled two-operand `einsum`, on `mxjax.dot_general`'s canonical form.

Each operand first loses the indices nothing else needs (diagonals, sums: `jnp.einsum` of
that operand alone, in its precision); shared indices are contracted or batch dims
(size-1 dims broadcast); the product's dims are transposed to the output's order. An outer
product contracts a unit axis added to both operands.
"""

from __future__ import annotations

import math
import string
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from mxjax._src import formats, operands
from mxjax._src.dot import dot_general


def einsum(subscripts: str, *arrays, fwd_format="e4m3", bwd_format="e5m2",
           block_size: int = formats.DEFAULT_BLOCK_SIZE, scale_mode="rceil", precision=None,
           preferred_element_type=None, out_sharding=None, recipe=None, rng=None,
           name: str = "") -> jax.Array:
  """`jnp.einsum(subscripts, a, b)` with both operands block-quantized along what they contract.

  Args:
    subscripts: a two-operand equation as `jnp.einsum` takes it, e.g. "bqhd,bkhd->bhqk",
      "...ij,jk", "bij,bjk->bki" (ellipses, implicit output and repeated indices allowed).
    *arrays: two bfloat16 / float16 / float32 arrays `a, b` (or MXArrays, as
      `dot_general` takes them, when no index needs to be taken out of them first).
    fwd_format, bwd_format, block_size, scale_mode, precision: as in `mxjax.dot_general`.
    preferred_element_type, recipe, rng, name: as in `mxjax.dot_general`.
    out_sharding: the output's sharding under Explicit mesh axes, as `jnp.einsum` takes it.

  Returns:
    The array `jnp.einsum(subscripts, a, b)` would give, in the operands' result dtype
    (or `preferred_element_type`).
  """
  if len(arrays) != 2:
    raise TypeError(f"mxjax.einsum takes exactly two operands, got {len(arrays)}: contract "
                    "more of them with one call per pair")
  a, b = operands.promote_weak(*arrays)
  out_dtype = preferred_element_type or operands.result_dtype(a, b)

  def mx_dot(a, b, dims, out_sharding=None):
    return dot_general(a, b, dims, fwd_format=fwd_format, bwd_format=bwd_format,
                       block_size=block_size, scale_mode=scale_mode, precision=precision,
                       preferred_element_type=out_dtype, out_sharding=out_sharding,
                       recipe=recipe, rng=rng, name=name)

  return einsum_as_dot_general(subscripts, a, b, mx_dot, out_sharding)


def einsum_as_dot_general(subscripts: str, a, b, dot: Callable,
                          out_sharding=None) -> jax.Array:
  """A two-operand einsum by `dot(a, b, dimension_numbers[, out_sharding=])`, a function
  with `lax.dot_general`'s contract (`out_sharding` moved to the product's dim order)."""
  a_shape, b_shape = operands.info(a, "a")[0], operands.info(b, "b")[0]
  a_ix, b_ix, out_ix = parse_subscripts(subscripts, len(a_shape), len(b_shape))
  sizes = _index_sizes(subscripts, (a_ix, b_ix), (a_shape, b_shape))
  a, a_ix = _keep_needed(a, a_ix, b_ix + out_ix)
  b, b_ix = _keep_needed(b, b_ix, a_ix + out_ix)
  shared = [i for i in a_ix if i in b_ix]
  batch = [i for i in shared if i in out_ix]
  contract = [i for i in shared if i not in out_ix]
  a, b = _broadcast_shared(a, a_ix, b, b_ix, shared, sizes)
  if not contract:  # an outer product: contract a unit axis
    unit = next(c for c in string.ascii_letters if c not in a_ix + b_ix + out_ix)
    a, b = jnp.expand_dims(a, -1), jnp.expand_dims(b, -1)
    a_ix, b_ix, contract = a_ix + unit, b_ix + unit, [unit]
  dims = (tuple(a_ix.index(i) for i in contract), tuple(b_ix.index(i) for i in contract)), (
      tuple(a_ix.index(i) for i in batch), tuple(b_ix.index(i) for i in batch))
  product_ix = batch + [i for i in a_ix if i not in shared and i in out_ix] + [
      i for i in b_ix if i not in shared and i in out_ix]
  if out_sharding is None:
    out = dot(a, b, dims)
  else:
    out = dot(a, b, dims, out_sharding=_in_product_order(out_sharding, out_ix, product_ix))
  return jnp.transpose(out, [product_ix.index(i) for i in out_ix])


def _in_product_order(out_sharding, out_ix: str, product_ix: list[str]) -> NamedSharding:
  """The einsum output's sharding, its spec entries moved to the product's dim order."""
  out_sharding = operands.named(out_sharding)
  spec = tuple(out_sharding.spec) + (None,) * (len(out_ix) - len(out_sharding.spec))
  return NamedSharding(out_sharding.mesh,
                       PartitionSpec(*(spec[out_ix.index(i)] for i in product_ix)))


def parse_subscripts(subscripts: str, a_ndim: int, b_ndim: int) -> tuple[str, str, str]:
  """(a's, b's, output's) index letters, ellipses expanded to fresh letters."""
  if not isinstance(subscripts, str):
    raise TypeError(f"mxjax.einsum needs a subscripts string, got {type(subscripts).__name__}")
  eq = subscripts.replace(" ", "")
  inputs, arrow, output = eq.partition("->")
  operands = inputs.split(",")
  if len(operands) != 2:
    raise ValueError(f"mxjax.einsum takes exactly two operands; {subscripts!r} has "
                     f"{len(operands)}")
  for part in (*operands, output):
    if part.replace("...", "").strip(string.ascii_letters) or part.count("...") > 1:
      raise ValueError(f"mxjax.einsum: bad subscripts {subscripts!r} (letters and at most "
                       "one '...' per term)")
  used = set(eq) & set(string.ascii_letters)
  fresh = [c for c in string.ascii_letters if c not in used]
  ellipsis_ndim = max(a_ndim - len(operands[0].replace("...", "")) if "..." in operands[0] else 0,
                      b_ndim - len(operands[1].replace("...", "")) if "..." in operands[1] else 0)
  ellipsis = "".join(fresh[:ellipsis_ndim])

  def expand(term: str, ndim: int | None) -> str:
    if "..." not in term:
      return term
    n = ellipsis_ndim if ndim is None else ndim - len(term.replace("...", ""))
    return term.replace("...", ellipsis[ellipsis_ndim - n:] if n > 0 else "")

  a_ix, b_ix = expand(operands[0], a_ndim), expand(operands[1], b_ndim)
  for name, ix, ndim in (("a", a_ix, a_ndim), ("b", b_ix, b_ndim)):
    if len(ix) != ndim:
      raise ValueError(f"mxjax.einsum: {subscripts!r} gives operand {name} {len(ix)} indices, "
                       f"but it has rank {ndim}")
  if arrow:
    out_ix = expand(output, None)
    if len(set(out_ix)) != len(out_ix) or set(out_ix) - set(a_ix + b_ix):
      raise ValueError(f"mxjax.einsum: output indices of {subscripts!r} must be distinct and "
                       "appear in an operand")
  else:  # implicit: the ellipsis, then the indices seen once, sorted
    once = sorted(c for c in set(a_ix + b_ix) if (a_ix + b_ix).count(c) == 1
                  and c not in ellipsis)
    out_ix = ellipsis + "".join(once)
  return a_ix, b_ix, out_ix


def _index_sizes(subscripts, indices, shapes) -> dict[str, int]:
  """Each index's size; a size-1 dim takes the other operand's size (broadcast)."""
  sizes: dict[str, int] = {}
  for ix, shape in zip(indices, shapes):
    for i, n in zip(ix, shape):
      if sizes.get(i, 1) == 1:
        sizes[i] = n
      elif n != 1 and sizes[i] != n:
        raise ValueError(f"mxjax.einsum: index {i!r} of {subscripts!r} has sizes {sizes[i]} "
                         f"and {n}")
  return sizes


def _keep_needed(x, ix: str, needed: str):
  """(x, its indices) with only the distinct indices of `ix` in `needed`."""
  keep = "".join(dict.fromkeys(i for i in ix if i in needed))
  if keep == ix:
    return x, ix
  return jnp.einsum(f"{ix}->{keep}", x), keep


def _broadcast_shared(a, a_ix, b, b_ix, shared, sizes):
  """Broadcasts size-1 dims of the indices both operands have to the other's size."""

  def grow(x, ix):
    have = operands.info(x, "operand")[0]
    shape = tuple(sizes[i] if i in shared else n for i, n in zip(ix, have))
    return x if shape == tuple(have) else jnp.broadcast_to(x, shape)

  return grow(a, a_ix), grow(b, b_ix)


def einsum_flops(subscripts: str, a_shape, b_shape) -> int:
  """2 x the product of every index's size: the FLOPs of a two-operand einsum."""
  a_ix, b_ix, _ = parse_subscripts(subscripts, len(a_shape), len(b_shape))
  sizes = _index_sizes(subscripts, (a_ix, b_ix), (a_shape, b_shape))
  return 2 * math.prod(sizes.values())
