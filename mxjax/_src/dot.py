"""Block-scaled `dot_general` with a custom VJP: MX forward, MX gradients.

Every product is canonicalized to `lhs [*B, M, K] x rhs [*B, K, N] -> [*B, M, N]`
(`mxjax.contraction`: batch dims kept as they are, free and contracting dims each
flattened, in `lax.dot_general`'s output order; for the usual `x[..., K] . w[K, N]` that
is only a reshape), so blocks always run along the flattened axis each product contracts:

  forward   out   = q(lhs, K) . q(rhs, K)             fwd_format
  dgrad     dlhs  = q(g, N)   . q(rhs, N)             g in bwd_format, rhs in fwd_format
  wgrad     drhs  = q(lhs, M) . q(g, M)               g in bwd_format, lhs in fwd_format

`q(x, A)` quantizes along A; both quantizations of an operand come from its
high-precision value in one pass (`quantize_2x`), and the forward keeps only the
quantized copies the backward needs; a forward with no backward (inference) quantizes
and dequantizes each array operand in one pass (`fake_quantize`: the MX values stay in
cache). The quantizers are straight-through: the gradient
of `q` is taken as the identity, so `dlhs = g . q(rhs)` and `drhs = q(lhs)^T . g` up to
the quantization of `g` and of the saved operands.

Each operand is dequantized to bfloat16, or to float32 on CPUs whose GEMM is faster there
(`mxjax._operand_dtype`), and XLA's dot accumulates in float32. Every product of two
dequantized elements is exact while both are at least 2^-126 (the smallest normal number
of both dtypes); a smaller element, which only occurs in blocks whose scale is near
2^-127, may be lost: XLA's CPU flushes subnormals. So |out - exact| <= the sum of
|a_k b_k| over such elements, plus f32 accumulation rounding (tests/test_dot_vs_oracle.py).
XLA's CPU runtime rejects a bf16 x bf16 -> f32 dot in some layouts ("Unsupported element
type for DotThunk::Execute"): where a transpose of the result is folded in (so the product
sits behind an optimization barrier), and, under vmap, where the lhs contracts its first
dim (an ensemble's weight gradient: that lhs is then transposed ahead of the dot).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_batching import custom_vmap
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero
from jax.sharding import NamedSharding, PartitionSpec

from mxjax._src import contraction, formats, products, sharding
from mxjax._src.operand_dtype import cpu_operand_dtype
from mxjax._src.mxarray import MXArray
from mxjax._src.quantize import fake_quantize, quantize_2x

DimensionNumbers = tuple[tuple[Sequence[int], Sequence[int]], tuple[Sequence[int], Sequence[int]]]


@dataclasses.dataclass(frozen=True)
class _DotConfig:
  lhs: contraction.Layout
  rhs: contraction.Layout
  fwd_format: str
  bwd_format: str
  block_size: int
  scale_mode: str
  out_dtype: Any
  lhs_dtype: Any
  rhs_dtype: Any
  # Explicit axes: the primal operands' shardings (their cotangents get the same) and the
  # requested output sharding; None where the type names no mesh axis.
  lhs_sharding: Any = None
  rhs_sharding: Any = None
  out_sharding: Any = None
  # Whether each operand is an array (differentiable), not MXArrays (constants).
  lhs_array: bool = True
  rhs_array: bool = True


def dot_general(lhs, rhs, dimension_numbers: DimensionNumbers, *, fwd_format="e4m3",
                bwd_format="e5m2", block_size: int = formats.DEFAULT_BLOCK_SIZE,
                scale_mode="rceil", precision=None, preferred_element_type=None,
                out_sharding=None) -> jax.Array:
  """`lax.dot_general` with both operands MX-quantized along the contraction.

  Args:
    lhs, rhs: bfloat16 / float16 / float32 arrays, or `MXArray`s quantized ahead of time
      along their (single) contracting dimension, used as they are. An operand may also
      be a pair `(along_contraction, along_free)` of MXArrays, as `quantize_2x` makes for
      a 2-D weight; the second is used for the other operand's gradient. MXArray operands
      are constants: differentiating with respect to one is a TypeError (E8M0 scales have
      no zero cotangent; `quantized_model_init` keeps its kernels out of the params).
    dimension_numbers: `((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))` as
      in `lax.dot_general`; any number of contracting and batch dims, any order.
    fwd_format: element format of both operands in the forward product.
    bwd_format: element format of the output gradient in dgrad and wgrad.
    block_size, scale_mode: as in `mxjax.quantize`.
    precision: taken as `lax.dot_general` takes it (Flax's layers pass theirs to an
      injected `dot_general`), with nothing to choose: the products of MX values are
      exact and accumulate in f32, as `Precision.HIGHEST` would.
    preferred_element_type: output dtype; default: the operands' result type.
    out_sharding: the output's sharding under Explicit mesh axes (a NamedSharding, or a
      PartitionSpec of the mesh set by `jax.set_mesh`), as in `lax.dot_general`: needed,
      as there, when a contracting dim is sharded.

  Returns:
    An array of shape `batch + lhs free + rhs free` (as `lax.dot_general`).
  """
  del precision  # see Args
  (lc, rc), (lb, rb) = dimension_numbers
  lhs, rhs = promote_weak_operands(lhs, rhs)
  lhs_info, rhs_info = _operand_info(lhs, "lhs"), _operand_info(rhs, "rhs")
  lhs_layout = contraction.layout(lhs_info[0], lc, lb, "lhs", contract_first=False)
  rhs_layout = contraction.layout(rhs_info[0], rc, rb, "rhs", contract_first=True)
  for name, dims_l, dims_r in (("contracting", lc, rc), ("batch", lb, rb)):
    sizes_l, sizes_r = lhs_layout.sizes(tuple(dims_l)), rhs_layout.sizes(tuple(dims_r))
    if sizes_l != sizes_r:
      raise ValueError(f"mxjax.dot_general: {name} dimension sizes differ: lhs {sizes_l} "
                       f"(dims {tuple(dims_l)}) vs rhs {sizes_r} (dims {tuple(dims_r)})")
  out_dtype = jnp.dtype(preferred_element_type or jnp.result_type(lhs_info[1], rhs_info[1]))
  fwd, bwd = formats.element_format(fwd_format), formats.element_format(bwd_format)
  for fmt in (fwd, bwd):
    formats.check_block_size(block_size, fmt)
  config = _DotConfig(lhs_layout, rhs_layout, fwd.name, bwd.name, int(block_size),
                      formats.scale_mode(scale_mode).value, out_dtype, lhs_info[1], rhs_info[1],
                      _typed_sharding(lhs), _typed_sharding(rhs), _named(out_sharding),
                      _is_array(lhs), _is_array(rhs))
  # Under shard_map, an operand replicated over an axis the other varies over is cast to
  # varying here, outside the custom VJP: the cast's transpose psums its gradient.
  with products.marked("dot_general", lhs_info[0], rhs_info[0],
                       products.dot_flops(lhs_info[0], rhs_info[0], dimension_numbers),
                       f"MX {fwd.name}/{bwd.name}, block {block_size}"):
    return _mx_dot(config, *sharding.vary_alike(lhs, rhs))


def matmul(a, b, **kwargs) -> jax.Array:
  """`a @ b` with `jnp.matmul`'s shapes, via `dot_general` (keyword arguments as there).

  a [..., M, K] (or [K]: a vector) and b [..., K, N] (or [K]); batch dims broadcast as in
  `jnp.matmul`, and a vector's dim is dropped from the output. An MXArray (or pair) operand
  keeps its shape: b [K, N], or batch dims equal to the other's; `out_sharding` needs
  operands of rank >= 2 and no broadcasting.

  Args:
    a: bf16 / f16 / f32 array [..., M, K] or [K], or an MXArray (pair) quantized along K.
    b: bf16 / f16 / f32 array [..., K, N] or [K], or an MXArray (pair) quantized along K.
    **kwargs: `dot_general`'s keyword arguments (`fwd_format`, `bwd_format`,
      `block_size`, `scale_mode`, `preferred_element_type`, `out_sharding`, ...).

  Returns:
    An array of `jnp.matmul(a, b)`'s shape, of the operands' result dtype unless
    `preferred_element_type` says otherwise.

  Raises:
    ValueError: a scalar operand, batch dims that do not broadcast, or broadcasting that
      MXArray operands or `out_sharding` cannot take.
  """
  a, b = promote_weak_operands(a, b)
  a_shape, b_shape = _operand_info(a, "a")[0], _operand_info(b, "b")[0]
  if not a_shape or not b_shape:
    raise ValueError(f"mxjax.matmul needs operands of rank >= 1; got {a_shape}, {b_shape}")
  if kwargs.get("preferred_element_type") is None:
    kwargs["preferred_element_type"] = jnp_result_dtype(a, b)
  if len(b_shape) == 2 or (len(a_shape) == len(b_shape) and a_shape[:-2] == b_shape[:-2]):
    batch = tuple(range(len(b_shape) - 2))
    dims = (((len(a_shape) - 1,), (len(b_shape) - 2,)), (batch, batch))
    return dot_general(a, b, dims, **kwargs)
  if not all(_is_array(x) for x in (a, b)) or kwargs.get("out_sharding") is not None:
    raise ValueError(
        f"mxjax.matmul: operands {a_shape} @ {b_shape} need a vector operand or broadcast "
        "batch dims, which only arrays without out_sharding take; quantize after "
        "broadcasting, or broadcast first")
  a2 = a[None, :] if len(a_shape) == 1 else a
  b2 = b[:, None] if len(b_shape) == 1 else b
  try:
    batch_shape = jnp.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
  except ValueError:
    raise ValueError(f"mxjax.matmul: batch dims of {a_shape} and {b_shape} do not "
                     "broadcast") from None
  if len(b2.shape) > 2 or len(a2.shape) > 2:
    a2 = jnp.broadcast_to(a2, batch_shape + a2.shape[-2:])
    b2 = jnp.broadcast_to(b2, batch_shape + b2.shape[-2:])
  y = matmul(a2, b2, **kwargs)
  if len(b_shape) == 1:  # drop the vectors' dims
    y = y[..., 0]
  if len(a_shape) == 1:
    y = y[..., 0, :] if len(b_shape) > 1 else y[..., 0]
  return y


def jnp_result_dtype(a, b):
  """The dtype `jnp.matmul` / `jnp.einsum` give `a` and `b`: weak types count (a bf16
  array and a weakly typed f32 one give bf16); an MXArray counts as its high-precision
  dtype."""
  return jnp.result_type(*(x if _is_array(x) else _operand_info(x, "operand")[1]
                           for x in (a, b)))


# ---------------------------------------------------------------------------------------


def promote_weak_operands(lhs, rhs):
  """A weakly typed array operand of a dtype MX cannot quantize (a Python scalar's f64
  under `jax_enable_x64`) cast to the dtype jnp's promotion gives it with the other
  operand, as `jnp.matmul` does (f32 with an f32 array); other operands as they are."""
  def promoted(x):
    if (not _is_array(x) or not getattr(jax.typeof(x), "weak_type", False)
        or jnp.dtype(x.dtype) in formats.HIGH_PRECISION_DTYPES):
      return x
    return x.astype(jnp_result_dtype(lhs, rhs))

  return promoted(lhs), promoted(rhs)


def _is_array(x) -> bool:
  """Whether an operand is an array (differentiable), not an MXArray or an MXArray pair."""
  return not isinstance(x, (MXArray, tuple))


def _typed_sharding(x) -> NamedSharding | None:
  """x's sharding when its mesh has Explicit axes (arrays only), else None."""
  return sharding.explicit_sharding(x) if _is_array(x) else None


def _named(out_sharding) -> NamedSharding | None:
  if out_sharding is None or isinstance(out_sharding, NamedSharding):
    return out_sharding
  if not isinstance(out_sharding, PartitionSpec):
    raise TypeError("mxjax.dot_general: out_sharding must be a NamedSharding or a "
                    f"PartitionSpec, got {type(out_sharding).__name__}")
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    raise ValueError("mxjax.dot_general: out_sharding as a PartitionSpec needs a mesh set "
                     "with jax.set_mesh(mesh); or pass a NamedSharding")
  return NamedSharding(mesh, out_sharding)


def _operand_info(x, name: str):
  """(shape, high-precision dtype) of an array, an MXArray or an MXArray pair."""
  if isinstance(x, tuple):
    if len(x) != 2 or not all(isinstance(a, MXArray) for a in x):
      raise TypeError(f"mxjax.dot_general: a tuple {name} must be a pair of MXArrays "
                      "(along the contraction, along the free dim)")
    if x[0].shape != x[1].shape:
      raise ValueError(f"mxjax.dot_general: the MXArray pair for {name} has shapes "
                       f"{x[0].shape} and {x[1].shape}")
    x = x[0]
  if isinstance(x, MXArray):
    return x.shape, jnp.dtype(x.dtype)
  x = jnp.asarray(x) if not isinstance(x, jax.Array) else x
  if jnp.dtype(x.dtype) not in formats.HIGH_PRECISION_DTYPES:
    raise TypeError(f"mxjax.dot_general needs bfloat16, float16 or float32 operands; {name} "
                    f"has dtype {jnp.dtype(x.dtype).name}")
  return x.shape, jnp.dtype(x.dtype)


def _canonical_mx(a: MXArray, layout: contraction.Layout, role: str, name: str) -> MXArray:
  """An MXArray operand in canonical form, quantized along K (role "contract") or along
  the free axis (role "free")."""
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


def _canonical_operands(config: _DotConfig, lhs, rhs):
  """The array operands in canonical form (MXArrays as they are). Under Explicit axes an
  operand whose contraction is split over an axis the other one splits another dim over
  (FSDP) is moved first, once (`sharding.unshared_contraction`)."""
  lhs_c = config.lhs.to_canonical(lhs) if config.lhs_array else lhs
  rhs_c = config.rhs.to_canonical(rhs) if config.rhs_array else rhs
  if config.lhs_array != config.rhs_array:  # one stored MX operand: gather it as MX
    if config.lhs_array:
      return lhs_c, _gathered_mx(rhs, config.rhs, lhs_c, config.lhs, config)
    return _gathered_mx(lhs, config.lhs, rhs_c, config.rhs, config), rhs_c
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
                                            a.shape[axis], config.block_size,
                                            jax.typeof(a).sharding.mesh)
    moved.append(a if entries is None else jax.sharding.reshard(a, PartitionSpec(*entries)))
  return tuple(moved)


def _gathered_mx(x, layout: contraction.Layout, other_c, other_layout: contraction.Layout,
                 config: _DotConfig):
  """A stored MX operand (an MXArray or a pair) whose contracted dim is split, under
  Explicit axes, over a mesh axis the other operand uses for another dim (FSDP: a weight
  stored once, sharded over the batch's axis): its codes and scales moved first, as
  `unshared_contraction` moves a high-precision operand. So the step gathers
  `bits/8 + 1/block` bytes per weight, not its dequantized value."""
  other = sharding.typed_spec(other_c)
  if other is None or len(layout.contract) != 1:
    return x

  def move(a: MXArray) -> MXArray:
    spec = sharding.typed_spec(a.data)
    if spec is None:
      return a
    entries = sharding.unshared_contraction(
        spec, other, layout.contract[0], other_layout.contract_axis, a.shape[layout.contract[0]],
        config.block_size, jax.typeof(a.data).sharding.mesh)
    if entries is None:
      return a
    if a.axis != layout.contract[0]:  # blocks along another dim: keep them whole there
      entries = tuple(e if i != a.axis else spec[i] for i, e in enumerate(entries))
    return dataclasses.replace(a, data=_moved_bytes(a.data, PartitionSpec(*entries)),
                               scales=_moved_bytes(a.scales, PartitionSpec(*entries)))

  return tuple(move(a) for a in x) if isinstance(x, tuple) else move(x)


def _moved_bytes(a: jax.Array, spec: PartitionSpec) -> jax.Array:
  """`a` (1-byte codes or scales) resharded to `spec` as uint8: XLA's CPU would widen
  float8 values to f16 / f32 for the collective; bytes move as they are."""
  moved = jax.sharding.reshard(lax.bitcast_convert_type(a, jnp.uint8), spec)
  return lax.bitcast_convert_type(moved, a.dtype)


@dataclasses.dataclass(frozen=True)
class _QuantizedOnUse:
  """An array operand of a product without backward, quantized along its contraction only
  as it is dequantized for the product: one `fake_quantize` pass, whose values equal
  `quantize(...).dequantize(dtype)` bit for bit (the MX values never reach memory)."""
  x: jax.Array
  axis: int
  config: _DotConfig

  @property
  def ndim(self) -> int:
    return self.x.ndim

  def dequantize(self, dtype) -> jax.Array:
    return fake_quantize(self.x, self.config.fwd_format, axis=self.axis,
                         block_size=self.config.block_size,
                         scale_mode=self.config.scale_mode, dtype=dtype)


def _prepare(x, layout: contraction.Layout, config: _DotConfig, name: str,
             for_backward: bool):
  """(quantized along K, quantized along F or dequantizable stand-in) in canonical form,
  from x in canonical form (an array) or as given (MXArrays); without `for_backward`
  (inference) the first is a `_QuantizedOnUse` for arrays and the second is None."""
  if isinstance(x, tuple):
    return (_canonical_mx(x[0], layout, "contract", name),
            _canonical_mx(x[1], layout, "free", name))
  if isinstance(x, MXArray):
    along_k = _canonical_mx(x, layout, "contract", name)
    return along_k, along_k  # the backward uses its exact values, never re-quantized
  if not for_backward:
    return _QuantizedOnUse(x, layout.contract_axis, config), None
  return quantize_2x(x, config.fwd_format,
                     axes=(layout.contract_axis, layout.free_axis),
                     block_size=config.block_size, scale_mode=config.scale_mode)


def _product(a, b, contract: tuple[int, int], out_sharding=None) -> jax.Array:
  """Exact product of two canonical MXArrays (or `_QuantizedOnUse`s) `[*B, X, Y]`,
  contracting the last-two-dims position `contract` (0 or 1) of each, f32-accumulated;
  sharded as `out_sharding` (Explicit axes) where given. -> `[*B, a's other dim, b's other
  dim]`.

  Both operands are dequantized (exactly) to the dtype the platform's GEMM is faster at:
  bf16, except on CPUs without bf16 dot instructions, where XLA's f32 GEMM is faster.
  """
  def with_operands(dtype, dot):
    return lambda: dot(a.dequantize(dtype), b.dequantize(dtype))

  dot = functools.partial(_dot, contract=contract, out_sharding=out_sharding)
  cpu_dtype = cpu_operand_dtype()
  cpu_dot = _cpu_bf16_dot(contract, out_sharding) if cpu_dtype == jnp.bfloat16 else dot
  return lax.platform_dependent(cpu=with_operands(cpu_dtype, cpu_dot),
                                default=with_operands(jnp.bfloat16, dot))


def _dot(a, b, contract: tuple[int, int], out_sharding=None) -> jax.Array:
  """f32-accumulated `lax.dot_general` of `[*B, X, Y]` arrays contracting the last-two-dims
  positions `contract`, behind an optimization barrier (see the module docstring)."""
  batch = tuple(range(a.ndim - 2))
  dims = (((len(batch) + contract[0],), (len(batch) + contract[1],)), (batch, batch))
  return lax.optimization_barrier(lax.dot_general(
      a, b, dims, preferred_element_type=jnp.float32, out_sharding=out_sharding))


@functools.lru_cache(maxsize=None)
def _cpu_bf16_dot(contract: tuple[int, int], out_sharding=None):
  """`_dot` for bf16 operands on CPU. Under vmap, an lhs that contracts its first dim (the
  weight gradient's `q(lhs, M)^T`) is transposed first, behind a barrier: XLA's CPU
  rejects the batched dot otherwise (see the module docstring). Unbatched, XLA's own
  handling of the transposed operand is faster (it converts or reads it in place)."""

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


def _out_groups(config: _DotConfig) -> list[tuple[int, ...]]:
  """The output's dim sizes per canonical dim: each batch dim, lhs free, rhs free."""
  return [*((n,) for n in config.lhs.sizes(config.lhs.batch)),
          config.lhs.sizes(config.lhs.free), config.rhs.sizes(config.rhs.free)]


def _reshard(x: jax.Array, named: NamedSharding | None) -> jax.Array:
  return x if named is None else jax.sharding.reshard(x, named)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _mx_dot(config: _DotConfig, lhs, rhs):
  return _forward(config, lhs, rhs, for_backward=False)[0]


def _forward(config: _DotConfig, lhs, rhs, for_backward: bool):
  lhs, rhs = _canonical_operands(config, lhs, rhs)
  lhs_k, lhs_m = _prepare(lhs, config.lhs, config, "lhs", for_backward)
  rhs_k, rhs_n = _prepare(rhs, config.rhs, config, "rhs", for_backward)
  groups = _out_groups(config)
  out_shape = sum(groups, ())
  out_sharding = contraction.merged_sharding(config.out_sharding, out_shape,
                                             [len(g) for g in groups])
  out = _product(lhs_k, rhs_k, (1, 0), out_sharding)  # [*B, M, K] . [*B, K, N] -> [*B, M, N]
  out = contraction.split_groups(out.astype(config.out_dtype), groups)
  return _reshard(out, config.out_sharding), (lhs_m, rhs_n)


def _mx_dot_fwd(config, lhs, rhs):
  lhs, rhs = _primal(lhs, "lhs"), _primal(rhs, "rhs")
  return _forward(config, lhs, rhs, for_backward=True)


def _mx_dot_bwd(config: _DotConfig, residuals, g):
  """(dlhs, drhs); None (a symbolic zero) for MXArray operands, and for both where g is."""
  if isinstance(g, SymbolicZero):
    return None, None
  lhs_m, rhs_n = residuals
  g = contraction.merge_groups(g, [len(group) for group in _out_groups(config)])  # [*B, M, N]
  if g.dtype not in formats.HIGH_PRECISION_DTYPES:  # a preferred_element_type of f64, fp8...
    g = g.astype(jnp.float32)
  g_n, g_m = quantize_2x(g, config.bwd_format, block_size=config.block_size,
                         scale_mode=config.scale_mode)
  # Each cotangent gets its primal's type (sharded as the primal under Explicit axes).
  dlhs = drhs = None
  if config.lhs_array:
    dlhs = _product(g_n, rhs_n, (1, 1), config.lhs.canonical_sharding(config.lhs_sharding))
    dlhs = _reshard(config.lhs.from_canonical(dlhs).astype(config.lhs_dtype),
                    config.lhs_sharding)
  if config.rhs_array:
    drhs = _product(lhs_m, g_m, (0, 0), config.rhs.canonical_sharding(config.rhs_sharding))
    drhs = _reshard(config.rhs.from_canonical(drhs).astype(config.rhs_dtype),
                    config.rhs_sharding)
  return dlhs, drhs


def _primal(x, name: str):
  """An operand of `_mx_dot_fwd` without its `CustomVJPPrimal` wrappers (symbolic zeros).
  Differentiating with respect to an MXArray operand is refused: E8M0 scales have no zero,
  so its cotangent could only be NaN."""
  is_primal = lambda leaf: isinstance(leaf, CustomVJPPrimal)  # noqa: E731
  leaves = jax.tree.leaves(x, is_leaf=is_primal)
  if not _is_array(x) and any(leaf.perturbed for leaf in leaves):
    raise TypeError(
        f"mxjax.dot_general: differentiating with respect to the MXArray {name}: MXArray "
        "operands are constants (their E8M0 scales have no zero cotangent). Differentiate "
        "the high-precision array it was quantized from, or keep the MXArray out of the "
        "differentiated arguments (close over it).")
  return jax.tree.map(lambda leaf: leaf.value, x, is_leaf=is_primal)


_mx_dot.defvjp(_mx_dot_fwd, _mx_dot_bwd, symbolic_zeros=True)
