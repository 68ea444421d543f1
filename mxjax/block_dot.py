"""The GEMM of the block-scaled recipes (`Recipe.block_roles()`): NVFP4, FP8 blocks, MX
with 2-D weights, stochastic rounding (SR) or a random Hadamard transform (RHT).

Canonical form `lhs = x [*B, M, K]`, `rhs = w [*B, K, N]` (`mxjax.contraction`):

  forward   out   = q(x, K) . q(w, K)                       / (S_x S_w)
  dgrad     dx    = q(g, N; SR) . q(w, N)                   / (S_g S_w)
  wgrad     dw    = q(R x, M)^T . q(R g, M; SR)             / (S_x' S_g')

q quantizes to the role's BlockFormat (1-D blocks along the named axis, or 2-D tiles: a
2-D weight's q(w, K) and q(w, N) are the same values), S are the FP32 tensor scales where
the format has one (applied to the output, as a block-scaled GEMM's alpha), and R is the
RHT along M (it cancels: R^T R = I), where on. Products are of the dequantized values in
f32, f32-accumulated (exact where the element x scale product fits f32's 24 bits).

SR bits come from `block_codec.random_bits` on the global index of g's canonical form,
seeded from the key (one stream per copy), so any mesh gives the same bits. The forward
saves the high-precision operands and quantizes again in the backward (the same values).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from mxjax import block_codec, block_ops, contraction, formats, products, sharding
from mxjax.block_recipes import BlockRoles

_MISSING_KEY = (
    "{where}: stochastic rounding (recipe {recipe}) needs a random key for the backward "
    "pass. Linen: apply the model with rngs={{'mx': key}} (a new key each step, e.g. "
    "jax.random.fold_in(key, step)); mxjax.nnx modules: give them an nnx.Rngs with an 'mx' "
    "stream; mxjax.quantized(fn) and mxjax.nnx.quantize(model): call them with mx_rng=key; "
    "mxjax.block_dot.dot_general: pass rng=key. Or turn stochastic rounding off.")


@dataclasses.dataclass(frozen=True)
class _Config:
  lhs: contraction.Layout
  rhs: contraction.Layout
  roles: BlockRoles
  out_dtype: Any
  lhs_dtype: Any
  rhs_dtype: Any
  where: str
  recipe_name: str
  has_key: bool


def dot_general(lhs, rhs, dimension_numbers, roles: BlockRoles, *, rng=None, where: str = "",
                recipe_name: str = "", preferred_element_type=None, out_sharding=None):
  """`lax.dot_general` of two bf16 / f16 / f32 arrays under block-scaled `roles`.

  Args:
    lhs, rhs: the input (role x) and the weight (role w); any dimension numbers.
    roles: `BlockRoles` (from `recipe.block_roles()`).
    rng: a JAX key for stochastic rounding (needed when `roles.stochastic_rounding` and
      the product is differentiated); a new one per step.
    where: the GEMM's name (errors; it also fixes the RHT's signs).
    preferred_element_type: the output dtype (default: the operands' result type).
    out_sharding: passed to the forward product (Explicit mesh axes).
  """
  (lc, rc), (lb, rb) = dimension_numbers
  for name, x in (("lhs", lhs), ("rhs", rhs)):
    if jnp.dtype(x.dtype) not in formats.HIGH_PRECISION_DTYPES:
      raise TypeError(f"mxjax.block_dot.dot_general needs bfloat16, float16 or float32 "
                      f"arrays; {name} is {jnp.dtype(x.dtype).name}")
  lhs_l = contraction.layout(lhs.shape, lc, lb, "lhs", contract_first=False)
  rhs_l = contraction.layout(rhs.shape, rc, rb, "rhs", contract_first=True)
  if lhs_l.sizes(tuple(lc)) != rhs_l.sizes(tuple(rc)) or (
      lhs_l.sizes(tuple(lb)) != rhs_l.sizes(tuple(rb))):
    raise ValueError(f"{where or 'mxjax.block_dot'}: contracting / batch dim sizes differ: "
                     f"lhs {lhs.shape}, rhs {rhs.shape}, dims {dimension_numbers}")
  out_dtype = jnp.dtype(preferred_element_type or jnp.result_type(lhs.dtype, rhs.dtype))
  config = _Config(lhs_l, rhs_l, roles, out_dtype, jnp.dtype(lhs.dtype), jnp.dtype(rhs.dtype),
                   where, recipe_name, rng is not None)
  key = (jax.random.key_data(rng).astype(jnp.uint32).reshape(-1)[-2:] if rng is not None
         else jnp.zeros((2,), jnp.uint32))
  with products.marked("dot_general", lhs.shape, rhs.shape,
                       products.dot_flops(lhs.shape, rhs.shape, dimension_numbers),
                       recipe_name or "block-scaled"):
    out = _block_dot(config, lhs, rhs, key)
  if out_sharding is not None:
    out = jax.sharding.reshard(out, out_sharding)
  return out


def _groups(config: _Config):
  return [*((n,) for n in config.lhs.sizes(config.lhs.batch)),
          config.lhs.sizes(config.lhs.free), config.rhs.sizes(config.rhs.free)]


def _q(x, bf, axis: int, rand=None):
  """(dequantized values f32 without the tensor scale, decode factor 1/S or None)."""
  return block_ops.fake_quantize(x, bf, axis, rand)


def _dot(a, b, contract, like=None):
  """f32 product contracting dims `contract` of [*B, R, C] operands; `like`: an array whose
  sharding the result takes on Explicit mesh axes (a cotangent's primal), else None."""
  batch = tuple(range(a.ndim - 2))
  n = len(batch)
  out = None if like is None else sharding.explicit_sharding(like)
  return lax.dot_general(a, b, (((n + contract[0],), (n + contract[1],)), (batch, batch)),
                         precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32,
                         out_sharding=out)


def _scaled(out, *factors):
  for f in factors:
    if f is not None:
      out = out * f
  return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _block_dot(config: _Config, lhs, rhs, key):
  return _forward(config, lhs, rhs)


def _forward(config: _Config, lhs, rhs):
  x, w = config.lhs.to_canonical(lhs), config.rhs.to_canonical(rhs)
  qx, sx = _q(x, config.roles.x, -1)
  qw, sw = _q(w, config.roles.w, -2)
  out = _scaled(_dot(qx, qw, (1, 0)), sx, sw)
  return contraction.split_groups(out.astype(config.out_dtype), _groups(config))


def _fwd(config, lhs, rhs, key):
  return _forward(config, lhs, rhs), (lhs, rhs, key)


def _streams(config: _Config, key, shapes):
  """SR bits for the gradient's two copies (dgrad, wgrad), or Nones."""
  if not config.roles.stochastic_rounding:
    return [None] * len(shapes)
  if not config.has_key:
    raise ValueError(_MISSING_KEY.format(where=config.where or "mxjax.block_dot",
                                         recipe=config.recipe_name or config.roles))
  seeds = [key ^ jnp.asarray([0x9E3779B9 * (i + 1) % 2 ** 32, 0x85EBCA6B * (i + 1) % 2 ** 32],
                             jnp.uint32) for i in range(len(shapes))]
  return [block_codec.random_bits(s, shape) for s, shape in zip(seeds, shapes)]


def _bwd(config: _Config, residuals, g):
  lhs, rhs, key = residuals
  roles = config.roles
  x, w = config.lhs.to_canonical(lhs), config.rhs.to_canonical(rhs)
  g = contraction.merge_groups(g, [len(grp) for grp in _groups(config)])  # [*B, M, N]
  if g.dtype not in formats.HIGH_PRECISION_DTYPES:
    g = g.astype(jnp.float32)
  xm, gm = x, g
  if roles.random_hadamard_transform:
    signs = block_codec.rht_signs(roles.rht_seed, config.where, roles.hadamard_size)
    xm, gm = block_codec.rht(x, -2, signs), block_codec.rht(g, -2, signs)
  bits_n, bits_m = _streams(config, key, [g.shape, gm.shape])
  # dgrad: contract N.
  qg, sg = _q(g, roles.grad, -1, bits_n)
  qw, sw = _q(w, roles.w, -1)
  dx = _scaled(_dot(qg, qw, (1, 1), like=x), sg, sw)
  # wgrad: contract M (padded by the RHT: zero rows add nothing).
  qx, sx = _q(xm, roles.x, -2)
  qg2, sg2 = _q(gm, roles.grad, -2, bits_m)
  dw = _scaled(_dot(qx, qg2, (0, 0), like=w), sx, sg2)
  dlhs = config.lhs.from_canonical(dx).astype(config.lhs_dtype)
  drhs = config.rhs.from_canonical(dw).astype(config.rhs_dtype)
  return dlhs, drhs, None


_block_dot.defvjp(_fwd, _bwd)
