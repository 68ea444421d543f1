"""The one block-scaled product: a custom VJP over `Roles`, under `dot_general`, `einsum`
and the Flax modules, for every format. Canonical form `x [*B, M, K] . w [*B, K, N]`:

  forward   out = q(x, K) . q(w, K)                       / (S_x S_w)
  dgrad     dx  = q(g, N; SR) . q(w, N)                   / (S_g S_w)
  wgrad     dw  = q(R x, M)^T . q(R g, M; SR)             / (S_x S_g)

q quantizes to the role's format along the named axis (a 2-D tile's q(w, K) and q(w, N)
are one array), S are FP32 tensor scales (applied to the output), R is the random Hadamard
transform along M where the roles ask for it (R^T R = I), and SR is stochastic rounding
of the gradient from bits on the global index of g's canonical form.

Per-tensor FP8 (`TensorRoles`) is the case of one block per tensor: q(x) is x times one
f32 scale, cast to FP8 (one copy serves both products), S is that scale, and the forward
also returns the input and kernel amaxes; DelayedScaling's state (`tensors`) gives the
scales, and its cotangent is the next state (gradient overwrite).

A grouped product (`ragged_dot`: rows of x [M, K] grouped over w [G, K, N]) has its own
three GEMMs and lays out its M-axis copies group by group (`Config.grouped`).

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

from mxjax._src import (backend, codec, contraction, formats, fp8_block_gemm, hadamard, operands,
                        ops, stochastic)
from mxjax._src import state as state_lib
from mxjax._src.formats import BlockFormat, ScaleFormat
from mxjax._src.mxarray import MXArray
from mxjax._src.operand_dtype import cpu_operand_dtype
from mxjax._src.roles import Roles, TensorRoles


@dataclasses.dataclass(frozen=True)
class Config:
  """Everything static about one product."""

  lhs: contraction.Layout
  rhs: contraction.Layout
  roles: Roles | TensorRoles
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
  # ragged_dot: the GEMMs of rows grouped over matrices (`mxjax._src.ragged.GROUPED`).
  grouped: Any = None

  @property
  def out_groups(self) -> list[tuple[int, ...]]:
    """The output's dim sizes per canonical dim: each batch dim, lhs free, rhs free."""
    return [*((n,) for n in self.lhs.sizes(self.lhs.batch)),
            self.lhs.sizes(self.lhs.free), self.rhs.sizes(self.rhs.free)]


def run(config: Config, lhs, rhs, key=None, tensors=None, group_sizes=None):
  """The product of `config` (operands in their own layouts; `key` for SR; int32[G]
  `group_sizes` where grouped). `TensorRoles`: (product, {"input", "kernel"} -> f32[]
  amaxes), `tensors` DelayedScaling's state."""
  out, amaxes = _product(config, lhs, rhs, stochastic.seed_of(key), tensors, group_sizes)
  return out if amaxes is None else (out, amaxes)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _PerTensor:
  """An operand quantized with one scale (`TensorRoles`): FP8 values q = x * scale."""
  q: jax.Array
  scale: jax.Array  # f32[]

  def values(self, dtype):
    return self.q.astype(dtype), None  # `_dot_of` divides by both scales


# Differentiating per-tensor FP8's product twice (jax.hessian) raises, never an all-NaN
# result: its quantizer is jnp, differentiable.
_once = ops.no_derivative(lambda x: x, "mxjax's per-tensor FP8 product's gradient")


def _per_tensor(x, recipe, tensors, role: str):
  """(`_PerTensor`, amax f32[]) of x as tensor `role` ("input", "kernel", "grad")."""
  x = _once(x)
  scale, amax = state_lib.step_scale(x, recipe, role, tensors and tensors[role])
  q = codec.quantize_per_tensor(x, scale, recipe.bwd_format if role == "grad" else
                                recipe.fwd_format)
  return _PerTensor(q, scale), lax.stop_gradient(amax)


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
  """(values without the tensor scale in `dtype`, 1 / S or None) of an MXArray, `_OnUse`
  or `_PerTensor`."""
  if isinstance(a, (_OnUse, _PerTensor)):
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
  and quantizer (`_along_m`)."""
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


def _operand_dtype(*fmts: BlockFormat | None):
  """The narrowest dtype holding both operands' values exactly (see the module doc); FP8
  values (`_PerTensor`, format None) are bf16 values."""
  exact_bf16 = all(f is None or f.scale is not ScaleFormat.FP32 for f in fmts)
  return jnp.dtype(jnp.bfloat16 if exact_bf16 else jnp.float32)


def _fmt(a) -> BlockFormat | None:
  if isinstance(a, _PerTensor):
    return None
  return a.fmt if isinstance(a, _OnUse) else a.format


def _dot_of(a, b, contract: tuple[int, int], out_sharding=None, gemm=None) -> jax.Array:
  """f32 product of quantized canonical `[*B, X, Y]` operands contracting positions
  `contract` of the last two dims (or `gemm(a, b)` of their f32 values), tensor scales
  applied."""
  dtype = _operand_dtype(_fmt(a), _fmt(b))

  def with_operands(dtype, dot, a=a):
    def run_():
      (va, sa), (vb, sb) = _values(a, dtype), _values(b, dtype)
      out = dot(va, vb)
      if isinstance(a, _PerTensor):  # and b
        return out / (a.scale * b.scale)
      for s in (sa, sb):
        if s is not None:
          out = out * s
      return out
    return run_

  if gemm is not None:
    return with_operands(jnp.dtype(jnp.float32), gemm)()
  dot = functools.partial(_dot, contract=contract, out_sharding=out_sharding)
  cpu_dtype = cpu_operand_dtype() if dtype == jnp.bfloat16 else jnp.dtype(jnp.float32)
  if cpu_dtype != jnp.bfloat16:
    cpu = with_operands(cpu_dtype, dot)
  elif contract[0] == 0 and _transposable(a):  # a wgrad's lhs: see `_transposed`
    cpu = with_operands(cpu_dtype, _cpu_bf16_dot((1, contract[1]), out_sharding),
                        _transposed(a))
  else:
    cpu = with_operands(cpu_dtype, _cpu_bf16_dot(contract, out_sharding))
  branches = dict(cpu=cpu)
  if out_sharding is None and (gemm := _fp8_tensor_core_gemm(a, b, contract)) is not None:
    branches["cuda"] = gemm
  return lax.platform_dependent(**branches, default=with_operands(dtype, dot))


def _transposable(a) -> bool:
  """Whether `a` is an MXArray of 1-D blocks along its second to last axis."""
  return isinstance(a, MXArray) and not a.format.two_d and a.axis == a.ndim - 2


def _transposed(a: MXArray) -> MXArray:
  """`a` [*B, X, Y] (1-D blocks along X) as the MXArray of its transpose [*B, Y, X] along
  the last axis: the same codes, packed along X as rows pack theirs, and scales, swapped.
  XLA's CPU dot runs bf16 operands only where the lhs contracts its last dim (else it
  converts both to f32, at twice the cost); a transpose of the values would be folded
  into the dot, but one of the small codes is not."""
  return MXArray(data=jnp.swapaxes(a.data, -1, -2), scales=jnp.swapaxes(a.scales, -1, -2),
                 tensor_scale=a.tensor_scale, format=a.format, axis_from_end=-1,
                 length=a.length, dtype=a.dtype)


def _fp8_block(fmt: BlockFormat | None) -> bool:
  return (fmt is not None and fmt.element_format.bits == 8
          and fmt.block_size == fp8_block_gemm.BLOCK
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


def _along_m(config: Config, group_sizes):
  """q(T x, M) of a canonical [*B, M, N] array, `(x, fmt, seed=None) -> MXArray` (SR
  from stream 1 of `seed` where given), T its groups laid out (grouped) and the RHT; None
  where there is neither."""
  roles = config.roles
  rotate = None
  if roles.random_hadamard_transform:
    signs = hadamard.rht_signs(roles.rht_seed, config.where, roles.hadamard_size)
    rotate = functools.partial(_rht_quantized, signs=signs)
  if config.grouped is None:
    return rotate
  rotate, align = rotate or _quantized_along_m, _group_align(roles)
  return lambda x, fmt, seed=None: rotate(config.grouped.laid_out(x, group_sizes, align),
                                          fmt, seed)


def _quantized_along_m(x, fmt: BlockFormat, seed=None) -> MXArray:
  return _quantized(x, fmt, -2, _bits(seed, 1))


def _bits(seed, i: int) -> stochastic.Counter | None:
  """Stream `i`'s stochastic-rounding bits of a product's seed (None: nearest even), made
  by the quantize op."""
  return None if seed is None else stochastic.Counter(stochastic.stream(seed, i))


def _group_align(roles: Roles) -> int:
  """Where a grouped product's groups start along M: whole blocks and Hadamard runs."""
  return max(roles.x.block_size, roles.grad.block_size,
             roles.hadamard_size if roles.random_hadamard_transform else 1)


def _gemm(config: Config, which: str, group_sizes):
  """The grouped product's `which` GEMM of f32 values, or None (dense)."""
  if config.grouped is None:
    return None
  return functools.partial(getattr(config.grouped, which), group_sizes=group_sizes,
                           align=_group_align(config.roles))


def _rht_quantized(x, fmt: BlockFormat, seed=None, *, signs) -> MXArray:
  """q(R x, M) of a canonical [*B, M, N] array, M zero padded to a multiple of n =
  len(signs): the CPU kernels transform and quantize in one pass (`ops.fuses_rht`)."""
  x = hadamard.padded(x, -2, len(signs))
  axis = x.ndim - 2
  quantized = ops.quantize_raw(x, fmt, axis, _bits(seed, 1), rht=signs)
  return ops.as_mxarray(*quantized, fmt, axis, jax.ShapeDtypeStruct(x.shape, jnp.float32))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _product(config: Config, lhs, rhs, seed, tensors, group_sizes):
  return _forward(config, lhs, rhs, _settled(config, tensors), group_sizes,
                  for_backward=False)[0]


def _settled(config: Config, tensors):
  """DelayedScaling's tensors (or None) as one use (`mxjax.state.settle_tensor`)."""
  return tensors and {role: state_lib.settle_tensor(t, config.roles.recipe, role)
                      for role, t in tensors.items()}


def _forward(config: Config, lhs, rhs, tensors, group_sizes, for_backward: bool):
  """((out, amaxes or None), (lhs along M, rhs along N) for the backward)."""
  lhs, rhs = operands.canonical(config, lhs, rhs)
  roles = config.roles
  amaxes = None
  if isinstance(roles, TensorRoles):  # one copy serves both products
    (lhs_k, a_x), (rhs_k, a_w) = (_per_tensor(lhs, roles.recipe, tensors, "input"),
                                  _per_tensor(rhs, roles.recipe, tensors, "kernel"))
    lhs_m, rhs_n, amaxes = lhs_k, rhs_k, {"input": a_x, "kernel": a_w}
  else:
    lhs_k, lhs_m = _prepare(lhs, config.lhs, roles.x, "lhs", for_backward,
                            _along_m(config, group_sizes))
    rhs_k, rhs_n = _prepare(rhs, config.rhs, roles.w, "rhs", for_backward)
  groups = config.out_groups
  out_sharding = contraction.merged_sharding(config.out_sharding, sum(groups, ()),
                                             [len(g) for g in groups])
  out = _dot_of(lhs_k, rhs_k, (1, 0), out_sharding,  # [*B, M, K] . [*B, K, N] -> [*B, M, N]
                _gemm(config, "forward", group_sizes))
  out = contraction.split_groups(out.astype(config.out_dtype), groups)
  return (_reshard(out, config.out_sharding), amaxes), (lhs_m, rhs_n)


def _product_fwd(config, lhs, rhs, seed, tensors, group_sizes):
  lhs, rhs = _primal(lhs, "lhs"), _primal(rhs, "rhs")
  seed, tensors = _unwrapped(seed), _settled(config, _unwrapped(tensors))
  group_sizes = _unwrapped(group_sizes)
  out, residuals = _forward(config, lhs, rhs, tensors, group_sizes, for_backward=True)
  return out, (*residuals, seed, out[1], tensors, group_sizes)


def _gradient_copies(config: Config, g, seed, group_sizes):
  """(q(g, N), q(R g, M)) of the canonical gradient [*B, M, N]."""
  roles = config.roles
  fmt, rotate = roles.grad, _along_m(config, group_sizes)
  if not roles.stochastic_rounding:
    return _both(g, fmt, -1, -2, None if rotate is None else rotate(g, fmt))
  if not config.has_key:
    raise ValueError(stochastic.MISSING_KEY.format(where=config.where or "mxjax.dot_general",
                                                   recipe=config.recipe_name or roles))
  g_n = _quantized(g, fmt, -1, _bits(seed, 0))
  if rotate is not None:
    return g_n, rotate(g, fmt, seed)
  if fmt.two_d:  # one quantization serves both products
    return g_n, g_n
  return g_n, _quantized(g, fmt, -2, _bits(seed, 1))


def _product_bwd(config: Config, residuals, cotangents):
  """(dlhs, drhs, None, next tensors or None, None); None for MXArray operands, and for
  both where g is zero."""
  g, _ = cotangents  # the amaxes are not differentiable
  if isinstance(g, SymbolicZero):
    return None, None, None, None, None
  lhs_m, rhs_n, seed, amaxes, tensors, group_sizes = residuals
  g = contraction.merge_groups(g, [len(group) for group in config.out_groups])  # [*B, M, N]
  if g.dtype not in formats.HIGH_PRECISION_DTYPES:  # a preferred_element_type of f64, fp8...
    g = g.astype(jnp.float32)
  next_tensors = None
  if isinstance(config.roles, TensorRoles):
    g_n, a_g = _per_tensor(g, config.roles.recipe, tensors, "grad")
    g_m = g_n
    if tensors is not None:
      next_tensors = _next_tensors(config.roles.recipe, tensors, {**amaxes, "grad": a_g})
  else:
    g_n, g_m = _gradient_copies(config, g, seed, group_sizes)
  # Each cotangent gets its primal's type (sharded as the primal under Explicit axes).
  dlhs = drhs = None
  if config.lhs_array:
    dlhs = _dot_of(g_n, rhs_n, (1, 1), config.lhs.canonical_sharding(config.lhs_sharding),
                   _gemm(config, "dgrad", group_sizes))
    dlhs = _reshard(config.lhs.from_canonical(dlhs).astype(config.lhs_dtype),
                    config.lhs_sharding)
  if config.rhs_array:
    drhs = _dot_of(lhs_m, g_m, (0, 0), config.rhs.canonical_sharding(config.rhs_sharding),
                   _gemm(config, "wgrad", group_sizes))
    drhs = _reshard(config.rhs.from_canonical(drhs).astype(config.rhs_dtype),
                    config.rhs_sharding)
  return dlhs, drhs, None, next_tensors, None


def _next_tensors(recipe, tensors, amaxes):
  """DelayedScaling's next tensors: every role's amax of this step recorded."""
  state = state_lib.RecipeState(tensors=tensors, kind=state_lib.kind_of(recipe))
  return dict(state_lib.update(state, state_lib.batch_amaxes(amaxes, state), recipe).tensors)


def _unwrapped(tree):
  """`tree` without its `CustomVJPPrimal` wrappers."""
  is_primal = lambda leaf: isinstance(leaf, CustomVJPPrimal)  # noqa: E731
  return jax.tree.map(lambda leaf: leaf.value if is_primal(leaf) else leaf, tree,
                      is_leaf=is_primal)


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
  return _unwrapped(x)


_product.defvjp(_product_fwd, _product_bwd, symbolic_zeros=True)
