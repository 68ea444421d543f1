"""A product's operands (arrays, MXArrays, MXArray pairs): checks, canonical form, and the
moves Explicit mesh axes need (FSDP)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from mxjax._src import contraction, formats, sharding
from mxjax._src.mxarray import MXArray
from mxjax._src.roles import Roles


def is_array(x) -> bool:
  """Whether an operand is an array (differentiable), not an MXArray or an MXArray pair."""
  return not isinstance(x, (MXArray, tuple))


def info(x, name: str, where: str = "mxjax.dot_general"):
  """(shape, high-precision dtype) of an array, an MXArray or an MXArray pair."""
  if isinstance(x, tuple):
    if len(x) != 2 or not all(isinstance(a, MXArray) for a in x):
      raise TypeError(f"{where}: a tuple {name} must be a pair of MXArrays (along the "
                      "contraction, along the free dim)")
    if x[0].shape != x[1].shape:
      raise ValueError(f"{where}: the MXArray pair for {name} has shapes {x[0].shape} and "
                       f"{x[1].shape}")
    x = x[0]
  if isinstance(x, MXArray):
    return x.shape, jnp.dtype(x.dtype)
  x = jnp.asarray(x) if not isinstance(x, jax.Array) else x
  if jnp.dtype(x.dtype) not in formats.HIGH_PRECISION_DTYPES:
    raise TypeError(f"{where} needs bfloat16, float16 or float32 operands; {name} has dtype "
                    f"{jnp.dtype(x.dtype).name}")
  return x.shape, jnp.dtype(x.dtype)


def result_dtype(a, b):
  """The dtype `jnp.matmul` gives `a` and `b` (weak types count; an MXArray as its dtype)."""
  return jnp.result_type(*(x if is_array(x) else info(x, "operand")[1] for x in (a, b)))


def promote_weak(lhs, rhs):
  """A weakly typed operand of a dtype no format takes (f64 under x64) cast as
  `jnp.matmul` promotes it; other operands as they are."""
  def promoted(x):
    if (not is_array(x) or not getattr(jax.typeof(x), "weak_type", False)
        or jnp.dtype(x.dtype) in formats.HIGH_PRECISION_DTYPES):
      return x
    return x.astype(result_dtype(lhs, rhs))

  return promoted(lhs), promoted(rhs)


def typed_sharding(x) -> NamedSharding | None:
  """x's sharding when its mesh has Explicit axes (arrays only), else None."""
  return sharding.explicit_sharding(x) if is_array(x) else None


def named(out_sharding, where: str = "mxjax.dot_general") -> NamedSharding | None:
  """An `out_sharding` argument as a NamedSharding (a PartitionSpec needs `jax.set_mesh`)."""
  if out_sharding is None or isinstance(out_sharding, NamedSharding):
    return out_sharding
  if not isinstance(out_sharding, PartitionSpec):
    raise TypeError(f"{where}: out_sharding must be a NamedSharding or a PartitionSpec, got "
                    f"{type(out_sharding).__name__}")
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    raise ValueError(f"{where}: out_sharding as a PartitionSpec needs a mesh set with "
                     "jax.set_mesh(mesh); or pass a NamedSharding")
  return NamedSharding(mesh, out_sharding)


def canonical_mx(a: MXArray, layout: contraction.Layout, role: str, name: str) -> MXArray:
  """An MXArray operand in canonical form; `role`: "contract", "free" or "tile" (2-D)."""
  if role == "tile":
    if a.ndim != 2 or layout.perm != (0, 1):
      raise ValueError(
          f"mxjax.dot_general: the MXArray {name} holds 2-D tiles ({a.format}), which serve "
          f"a product that contracts one of its two dims as stored; this product needs the "
          f"dims of {a.shape} in another arrangement")
    return a
  along = {"contract": layout.contract, "free": layout.free}[role]
  if len(along) != 1 or a.axis != along[0]:
    raise ValueError(
        f"mxjax.dot_general: the MXArray {name} is quantized along axis {a.axis}, but the "
        f"product needs it quantized along its {'contracting' if role == 'contract' else 'free'}"
        f" dimension {along if len(along) != 1 else along[0]} (exactly one such dimension)")
  axis = layout.contract_axis if role == "contract" else layout.free_axis
  lengths = [len(g) for g in layout.groups]
  return dataclasses.replace(
      a, data=contraction.merge_groups(jnp.transpose(a.data, layout.perm), lengths),
      scales=contraction.merge_groups(jnp.transpose(a.scales, layout.perm), lengths),
      axis_from_end=axis)


def canonical(config, lhs, rhs):
  """The array operands in canonical form (MXArrays as they are), moved first under
  Explicit axes where FSDP needs (`sharding.unshared_contraction`; block-scaled roles:
  per-tensor FP8 reads one copy of each operand; grouped products are left as they are)."""
  lhs_c = config.lhs.to_canonical(lhs) if config.lhs_array else lhs
  rhs_c = config.rhs.to_canonical(rhs) if config.rhs_array else rhs
  if not isinstance(config.roles, Roles) or config.grouped is not None:
    return lhs_c, rhs_c
  block = config.roles.x.block_size
  if config.lhs_array != config.rhs_array:  # one stored quantized operand
    if config.lhs_array:
      return lhs_c, _gathered_mx(rhs, config.rhs, lhs_c, config.lhs)
    return _gathered_mx(lhs, config.lhs, rhs_c, config.rhs), rhs_c
  if not (config.lhs_array and config.rhs_array):
    return lhs_c, rhs_c
  specs = [sharding.typed_spec(a) for a in (lhs_c, rhs_c)]
  if None in specs:
    return lhs_c, rhs_c
  moved = []
  for a, layout, spec, other, other_layout in ((lhs_c, config.lhs, *specs, config.rhs),
                                               (rhs_c, config.rhs, *specs[::-1], config.lhs)):
    axis = layout.contract_axis
    entries = sharding.unshared_contraction(spec, other, axis, other_layout.contract_axis,
                                            a.shape[axis], block, jax.typeof(a).sharding.mesh)
    moved.append(a if entries is None else jax.sharding.reshard(a, PartitionSpec(*entries)))
  return tuple(moved)


def _gathered_mx(x, layout: contraction.Layout, other_c, other_layout: contraction.Layout):
  """A stored MXArray (or pair) moved as `unshared_contraction` moves an array operand
  (FSDP): the step gathers the format's bytes, not the dequantized value."""
  other = sharding.typed_spec(other_c)
  if other is None or len(layout.contract) != 1:
    return x

  def move(a: MXArray) -> MXArray:
    spec = sharding.typed_spec(a.data)
    if spec is None:
      return a
    entries = sharding.unshared_contraction(
        spec, other, layout.contract[0], other_layout.contract_axis, a.shape[layout.contract[0]],
        a.block_size, jax.typeof(a.data).sharding.mesh)
    if entries is None:
      return a
    if a.axis != layout.contract[0]:  # blocks along another dim: keep them whole there
      entries = tuple(e if i != a.axis else spec[i] for i, e in enumerate(entries))
    moved = {k: _moved_bytes(getattr(a, k), PartitionSpec(*entries)) for k in ("data", "scales")}
    return dataclasses.replace(a, **moved)

  return tuple(move(a) for a in x) if isinstance(x, tuple) else move(x)


def _moved_bytes(a: jax.Array, spec: PartitionSpec) -> jax.Array:
  """`a` resharded to `spec` as unsigned ints (XLA's CPU would widen float8 values)."""
  bits = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[jnp.dtype(a.dtype).itemsize]
  moved = jax.sharding.reshard(lax.bitcast_convert_type(a, bits), spec)
  return lax.bitcast_convert_type(moved, a.dtype)
