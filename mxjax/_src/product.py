"""The one block-scaled product: a custom VJP over `Roles`, under `dot_general`, `einsum`
and the Flax modules, for every format. Canonical form `x [*B, M, K] . w [*B, K, N]`:

  forward   out = q(x, K) . q(w, K)                       / (S_x S_w)
  dgrad     dx  = q(g, N; SR) . q(w, N)                   / (S_g S_w)
  wgrad     dw  = q(R x, M)^T . q(R g, M; SR)             / (S_x S_g)

q quantizes to the role's format along the named axis (a 2-D tile's q(w, K) and q(w, N)
are one array), S are FP32 tensor scales (applied to the output), R is the random Hadamard
transform along M where the roles ask for it (R^T R = I), and SR is stochastic rounding
of the gradient from bits on the global index of g's canonical form.

The forward keeps only the quantized copies the backward needs (`quantize_2x` where the
format allows); inference quantizes and dequantizes each array operand in one pass. The
quantizers are straight-through.

Operands are dequantized exactly to bf16 (f32 for FP32 non-power-of-two scales, and on
CPUs whose GEMM is faster there: `mxjax._src.operand_dtype`) and XLA's dot accumulates in
f32; a product of elements below 2^-126 may be lost (XLA's CPU flushes subnormals). XLA's
CPU rejects a bf16 x bf16 -> f32 dot in some layouts ("Unsupported element type for
DotThunk::Execute"): where a transpose of the result is folded in (hence the optimization
barrier), and, under vmap, where the lhs contracts its first dim (transposed first).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_batching import custom_vmap
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero
from jax.sharding import NamedSharding

from mxjax._src import (backend, contraction, formats, fp8_block_gemm, hadamard, operands, ops,
                        stochastic)
from mxjax._src.formats import BlockFormat, ScaleFormat
from mxjax._src.mxarray import MXArray
from mxjax._src.operand_dtype import cpu_operand_dtype
from mxjax._src.roles import Roles


@dataclasses.dataclass(frozen=True)
class Config:
  """Everything static about one product."""

  lhs: contraction.Layout
  rhs: contraction.Layout
  roles: Roles
  out_dtype: Any
  lhs_dtype: Any
  rhs_dtype: Any
  # Explicit axes: the operands' (and cotangents') and the output's shardings, or None.
  lhs_sharding: Any = None
  rhs_sharding: Any = None
  out_sharding: Any = None
  # Whether each operand is an array (differentiable), not MXArrays.
  lhs_array: bool = True
  rhs_array: bool = True
  where: str = ""  # the product's name: errors, and the RHT's signs
  recipe_name: str = ""
  has_key: bool = False

  @property
  def out_groups(self) -> list[tuple[int, ...]]:
    """The output's dim sizes per canonical dim: each batch dim, lhs free, rhs free."""
    return [*((n,) for n in self.lhs.sizes(self.lhs.batch)),
            self.lhs.sizes(self.lhs.free), self.rhs.sizes(self.rhs.free)]


def run(config: Config, lhs, rhs, key=None) -> jax.Array:
  """The product of `config` (operands in their own layouts; `key` for SR)."""
  return _product(config, lhs, rhs, stochastic.seed_of(key))


@dataclasses.dataclass(frozen=True)
class _OnUse:
  """An array operand quantized as it is dequantized, in one pass (`ops.values`)."""
  x: jax.Array
  fmt: BlockFormat
  axis: int
  rand: Any = None

  def values(self, dtype):
    return ops.values(self.x, self.fmt, self.axis % self.x.ndim, dtype, self.rand)


def _values(a, dtype):
  """(values without the tensor scale in `dtype`, 1 / S or None) of an MXArray / `_OnUse`."""
  if isinstance(a, _OnUse):
    return a.values(dtype)
  inv = None if a.tensor_scale is None else 1.0 / a.tensor_scale
  return ops.dequantize_raw(a, dtype, apply_tensor_scale=False), inv


def _quantized(x, fmt: BlockFormat, axis: int, rand=None) -> MXArray:
  """x quantized along `axis` (from the end) as an MXArray."""
  axis %= x.ndim
  return ops.as_mxarray(*ops.quantize_raw(x, fmt, axis, rand), fmt, axis, x)


def _both(x, fmt: BlockFormat, along: int, other: int, rotated=None):
  """(q(x, along), q(x, other)) of a canonical array; the second is `rotated` (q(R x),
  an MXArray) where given."""
  if rotated is not None:
    return _quantized(x, fmt, along), rotated
  if fmt.two_d:
    a = _quantized(x, fmt, -1)
    return a, a
  if (along, other) in ((-1, -2), (-2, -1)):
    ts = ops.tensor_scale(x, fmt)
    rd, rs, cd, cs = ops.quantize_2x_raw(x, fmt, ts)
    rows = ops.as_mxarray(rd, rs, ts, fmt, x.ndim - 1, x)
    cols = ops.as_mxarray(cd, cs, ts, fmt, x.ndim - 2, x)
    return (rows, cols) if along == -1 else (cols, rows)
  return _quantized(x, fmt, along), _quantized(x, fmt, other)


def _prepare(x, layout: contraction.Layout, fmt: BlockFormat, name: str, for_backward: bool,
             rotate=None):
  """(along K, along the free axis or None) in canonical form, from a canonical array or
  MXArrays as given; an `_OnUse` for arrays in inference. `rotate`: the free copy's RHT
  and quantizer (`_rht`)."""
  if isinstance(x, tuple):
    return (operands.canonical_mx(x[0], layout, "contract", name),
            operands.canonical_mx(x[1], layout, "free", name))
  if isinstance(x, MXArray):
    along_k = operands.canonical_mx(x, layout, "contract" if not x.format.two_d else "tile",
                                    name)
    return along_k, along_k  # the backward uses its exact values, never re-quantized
  if not for_backward:
    return _OnUse(x, fmt, layout.contract_axis), None
  return _both(x, fmt, layout.contract_axis, layout.free_axis,
               None if rotate is None else rotate(x, fmt))


def _operand_dtype(*fmts: BlockFormat):
  """The narrowest dtype holding both operands' values exactly (see the module doc)."""
  exact_bf16 = all(f.scale is not ScaleFormat.FP32 for f in fmts)
  return jnp.dtype(jnp.bfloat16 if exact_bf16 else jnp.float32)


def _fmt(a) -> BlockFormat:
  return a.fmt if isinstance(a, _OnUse) else a.format


def _dot_of(a, b, contract: tuple[int, int], out_sharding=None) -> jax.Array:
  """f32 product of quantized canonical `[*B, X, Y]` operands contracting positions
  `contract` of the last two dims, tensor scales applied."""
  dtype = _operand_dtype(_fmt(a), _fmt(b))

  def with_operands(dtype, dot):
    def run_():
      (va, sa), (vb, sb) = _values(a, dtype), _values(b, dtype)
      out = dot(va, vb)
      for s in (sa, sb):
        if s is not None:
          out = out * s
      return out
    return run_

  dot = functools.partial(_dot, contract=contract, out_sharding=out_sharding)
  cpu_dtype = cpu_operand_dtype() if dtype == jnp.bfloat16 else jnp.dtype(jnp.float32)
  cpu_dot = _cpu_bf16_dot(contract, out_sharding) if cpu_dtype == jnp.bfloat16 else dot
  branches = dict(cpu=with_operands(cpu_dtype, cpu_dot))
  if out_sharding is None and (gemm := _fp8_tensor_core_gemm(a, b, contract)) is not None:
    branches["cuda"] = gemm
  return lax.platform_dependent(**branches, default=with_operands(dtype, dot))


def _fp8_block(fmt: BlockFormat) -> bool:
  return (fmt.element_format.bits == 8 and fmt.block_size == fp8_block_gemm.BLOCK
          and fmt.scale in (ScaleFormat.FP32, ScaleFormat.FP32_POW2))


def _fp8_tensor_core_gemm(a, b, contract: tuple[int, int]):
  """The product of two FP8-block operands on Hopper's FP8 tensor cores
  (`mxjax._src.fp8_block_gemm`) where the GPU, build and shapes allow; else None."""
  fa, fb = _fmt(a), _fmt(b)
  if not (_fp8_block(fa) and _fp8_block(fb)) or (fa.two_d and fb.two_d) or (
      fa.element == fb.element == "e5m2"):
    return None
  if not backend.uses_kernel("cuda", fp8_block_gemm.TARGET) or not fp8_block_gemm.available():
    return None
  shape_a, shape_b = _shape(a), _shape(b)
  if len(shape_a) != 2 or len(shape_b) != 2:  # batched products: the dequantized path
    return None
  m, n, k = shape_a[1 - contract[0]], shape_b[1 - contract[1]], shape_a[contract[0]]
  swap = fa.two_d  # cuBLASLt takes the 2-D operand as b: compute (b . a^T)^T
  if fp8_block_gemm.shape_error(n, m, k) if swap else fp8_block_gemm.shape_error(m, n, k):
    return None

  def run():
    (ca, sa), (cb, sb) = _rows_by_k(a, contract[0]), _rows_by_k(b, contract[1])
    if swap:
      out = fp8_block_gemm.fp8_block_gemm(cb, sb, ca, sa, b_block=fa.block[0],
                                          out_dtype=jnp.float32)
      return out.T
    return fp8_block_gemm.fp8_block_gemm(ca, sa, cb, sb, b_block=fb.block[0],
                                         out_dtype=jnp.float32)

  return run


def _shape(a) -> tuple[int, ...]:
  return a.x.shape if isinstance(a, _OnUse) else a.shape


def _rows_by_k(a, contract: int):
  """(codes [rows, K], scales) of a 2-D operand whose position `contract` is K."""
  if isinstance(a, _OnUse):
    a = _quantized(a.x, a.fmt, a.axis, a.rand)
  if contract == 1:
    return a.data, a.scales
  return a.data.T, a.scales.T


def _dot(a, b, contract: tuple[int, int], out_sharding=None) -> jax.Array:
  """f32 `lax.dot_general` of `[*B, X, Y]` arrays, behind an optimization barrier."""
  batch = tuple(range(a.ndim - 2))
  dims = (((len(batch) + contract[0],), (len(batch) + contract[1],)), (batch, batch))
  precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
  return lax.optimization_barrier(lax.dot_general(
      a, b, dims, precision=precision, preferred_element_type=jnp.float32,
      out_sharding=out_sharding))


@functools.lru_cache(maxsize=None)
def _cpu_bf16_dot(contract: tuple[int, int], out_sharding=None):
  """`_dot` for bf16 on CPU; under vmap an lhs contracting its first dim is transposed."""

  @custom_vmap
  def dot(a, b):
    return _dot(a, b, contract, out_sharding)

  @dot.def_vmap
  def _batched(axis_size, in_batched, a, b):
    del axis_size
    c = contract
    if c[0] == 0:
      a, c = lax.optimization_barrier(jnp.swapaxes(a, -1, -2)), (1, c[1])
    in_axes = tuple(0 if batched else None for batched in in_batched)
    return jax.vmap(functools.partial(_dot, contract=c, out_sharding=out_sharding),
                    in_axes=in_axes)(a, b), True

  return dot


def _reshard(x: jax.Array, named: NamedSharding | None) -> jax.Array:
  return x if named is None else jax.sharding.reshard(x, named)


def _rht(config: Config):
  """q(R x, M) of a canonical [*B, M, N] array, `(x, fmt, seed=None) -> MXArray` (SR
  from stream 1 of `seed` where given), or None where the roles have no RHT."""
  roles = config.roles
  if not roles.random_hadamard_transform:
    return None
  signs = hadamard.rht_signs(roles.rht_seed, config.where, roles.hadamard_size)
  return functools.partial(_rht_quantized, signs=signs)


def _rht_quantized(x, fmt: BlockFormat, seed=None, *, signs) -> MXArray:
  """q(R x, M) of a canonical [*B, M, N] array, M zero padded to a multiple of n =
  len(signs). Where 1-D blocks tile a run of n, the transform's rows [*B, M/n, N, n] are
  quantized along their last axis (the same blocks, the same bits) and the small packed
  codes and scales moved into place, instead of the f32 rows."""
  n = len(signs)
  if fmt.two_d or n % fmt.block_size or n % fmt.element_format.codes_per_group:
    y = hadamard.rht(x, -2, signs)
    return _quantized(y, fmt, -2, None if seed is None else stochastic.bits_like(seed, 1, y))
  rows = hadamard.rht_rows(x, -2, signs)
  *batch, runs, cols, _ = rows.shape
  flat = rows.reshape(*batch, runs, cols * n)
  rand = None
  if seed is not None:  # element (m, c) of R x sits at [m // n, c * n + m % n] of flat
    index = stochastic.row_major_index((*batch, runs, n, cols))
    rand = stochastic.bits_like(seed, 1, flat, jnp.swapaxes(index, -1, -2).reshape(flat.shape))
  data, scales, ts = ops.quantize_raw(flat, fmt, flat.ndim - 1, rand)

  def along_m(a):  # [*B, M/n, N * k] -> [*B, M/n * k, N]
    return jnp.swapaxes(a.reshape(*batch, runs, cols, -1), -1, -2).reshape(*batch, -1, cols)

  return MXArray(data=along_m(data), scales=along_m(scales), tensor_scale=ts, format=fmt,
                 axis_from_end=-2, length=runs * n, dtype=jnp.dtype(jnp.float32))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _product(config: Config, lhs, rhs, seed):
  return _forward(config, lhs, rhs, for_backward=False)[0]


def _forward(config: Config, lhs, rhs, for_backward: bool):
  lhs, rhs = operands.canonical(config, lhs, rhs)
  roles = config.roles
  lhs_k, lhs_m = _prepare(lhs, config.lhs, roles.x, "lhs", for_backward, _rht(config))
  rhs_k, rhs_n = _prepare(rhs, config.rhs, roles.w, "rhs", for_backward)
  groups = config.out_groups
  out_sharding = contraction.merged_sharding(config.out_sharding, sum(groups, ()),
                                             [len(g) for g in groups])
  out = _dot_of(lhs_k, rhs_k, (1, 0), out_sharding)  # [*B, M, K] . [*B, K, N] -> [*B, M, N]
  out = contraction.split_groups(out.astype(config.out_dtype), groups)
  return _reshard(out, config.out_sharding), (lhs_m, rhs_n)


def _product_fwd(config, lhs, rhs, seed):
  lhs, rhs = _primal(lhs, "lhs"), _primal(rhs, "rhs")
  out, residuals = _forward(config, lhs, rhs, for_backward=True)
  return out, (*residuals, seed.value if isinstance(seed, CustomVJPPrimal) else seed)


def _gradient_copies(config: Config, g, seed):
  """(q(g, N), q(R g, M)) of the canonical gradient [*B, M, N]."""
  roles = config.roles
  fmt, rotate = roles.grad, _rht(config)
  if not roles.stochastic_rounding:
    return _both(g, fmt, -1, -2, None if rotate is None else rotate(g, fmt))
  if not config.has_key:
    raise ValueError(stochastic.MISSING_KEY.format(where=config.where or "mxjax.dot_general",
                                                   recipe=config.recipe_name or roles))
  g_n = _quantized(g, fmt, -1, stochastic.bits_like(seed, 0, g))
  if rotate is not None:
    return g_n, rotate(g, fmt, seed)
  if fmt.two_d:  # one quantization serves both products
    return g_n, g_n
  return g_n, _quantized(g, fmt, -2, stochastic.bits_like(seed, 1, g))


def _product_bwd(config: Config, residuals, g):
  """(dlhs, drhs, None); None for MXArray operands, and for both where g is zero."""
  if isinstance(g, SymbolicZero):
    return None, None, None
  lhs_m, rhs_n, seed = residuals
  g = contraction.merge_groups(g, [len(group) for group in config.out_groups])  # [*B, M, N]
  if g.dtype not in formats.HIGH_PRECISION_DTYPES:  # a preferred_element_type of f64, fp8...
    g = g.astype(jnp.float32)
  g_n, g_m = _gradient_copies(config, g, seed)
  # Each cotangent gets its primal's type (sharded as the primal under Explicit axes).
  dlhs = drhs = None
  if config.lhs_array:
    dlhs = _dot_of(g_n, rhs_n, (1, 1), config.lhs.canonical_sharding(config.lhs_sharding))
    dlhs = _reshard(config.lhs.from_canonical(dlhs).astype(config.lhs_dtype),
                    config.lhs_sharding)
  if config.rhs_array:
    drhs = _dot_of(lhs_m, g_m, (0, 0), config.rhs.canonical_sharding(config.rhs_sharding))
    drhs = _reshard(config.rhs.from_canonical(drhs).astype(config.rhs_dtype),
                    config.rhs_sharding)
  return dlhs, drhs, None


def _primal(x, name: str):
  """An operand without its `CustomVJPPrimal` wrappers; refuses a perturbed MXArray (E8M0
  scales have no zero cotangent)."""
  is_primal = lambda leaf: isinstance(leaf, CustomVJPPrimal)  # noqa: E731
  leaves = jax.tree.leaves(x, is_leaf=is_primal)
  if not operands.is_array(x) and any(leaf.perturbed for leaf in leaves):
    raise TypeError(
        f"mxjax.dot_general: differentiating with respect to the MXArray {name}: MXArray "
        "operands are constants (their scales have no zero cotangent). Differentiate "
        "the high-precision array it was quantized from, or keep the MXArray out of the "
        "differentiated arguments (close over it).")
  return jax.tree.map(lambda leaf: leaf.value, x, is_leaf=is_primal)


_product.defvjp(_product_fwd, _product_bwd, symbolic_zeros=True)
