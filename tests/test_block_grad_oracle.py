"""The block recipes' forward, dgrad and wgrad (`mxjax.quantized` under `autocast`)
against an oracle built here from `mxjax.reference` (`block_quantize` /
`block_dequantize` of each role's `BlockFormat`) and a random Hadamard transform written
here from its definition:

  forward  y  = q(x, K) . q(w, K)                  / (S_x S_w)
  dgrad    dx = q(g, N) . q(w, N)^T                / (S_g S_w)
  wgrad    dw = q(R x, M)^T . q(R g, M)            / (S_x' S_g')

q: the role's format along the named axis (a 2-D weight: one tiling for both), S: its FP32
tensor scale (NVFP4), R: the RHT along M on BOTH wgrad operands, where on (R^T R = I).
With stochastic rounding off the library equals the oracle to f32 accumulation order;
with it on, the gradients stay within an error bound against f32 that a one-sided RHT
(R on one operand only) breaks, as the oracle shows here with its own random bits.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import mxjax
from mxjax import reference

HI = lax.Precision.HIGHEST
M = K = N = 128  # one shape for every operand: the oracle's quantizers compile once per format
NAME = "product 'dot_general_0'"  # the GEMM's name under mxjax.quantized: seeds its signs


def data(seed: int = 0):
  """x [M, K], w [K, N], g [M, N] f32: 8-bit integers over 32 times a power of two per row
  (2^-3 .. 2^3), so every block gets its own scale and every sum of 16 of them, as the RHT
  makes, is exact in f32 (whatever the summation order)."""
  rng = np.random.default_rng(seed)

  def make(rows, cols, scale):
    ints = rng.integers(-128, 128, (rows, cols)).astype(np.float32) / 32
    return jnp.asarray(ints * np.exp2(rng.integers(-3, 4, (rows, 1))) * scale, jnp.float32)

  return make(M, K, 1.0), make(K, N, 0.125), make(M, N, 1.0)


# -- the oracle -------------------------------------------------------------------------


def sylvester(n: int) -> np.ndarray:
  """The n x n Hadamard matrix: H_1 = [1], H_2m = [[H_m, H_m], [H_m, -H_m]]."""
  h = np.ones((1, 1))
  while len(h) < n:
    h = np.block([[h, h], [h, -h]])
  return h


def rht_signs(recipe, name: str = NAME) -> np.ndarray:
  """The random signs a recipe fixes for one GEMM from its `rht_seed` and the GEMM's name:
  -1 where numpy's generator seeded with [rht_seed, crc32(name)] draws below 1/2."""
  n = recipe.roles().hadamard_size
  rng = np.random.default_rng([recipe.roles().rht_seed, zlib.crc32(name.encode())])
  return np.where(rng.random(n) < 0.5, -1.0, 1.0)


def rht(a, signs):
  """Each run of n = len(signs) rows of a [M, C] times H_n diag(signs) / sqrt(n)."""
  n = len(signs)
  mat = jnp.asarray(sylvester(n) * signs[None, :] / np.sqrt(n), jnp.float32)
  blocks = a.reshape(a.shape[0] // n, n, a.shape[1])
  return jnp.einsum("ij,bjc->bic", mat, blocks, precision=HI).reshape(a.shape)


@jax.jit(static_argnums=1)
def _q_rows(a, bf, rand=None):
  codes, scales, ts = reference.block_quantize(a, bf, axis=-1, rand=rand)
  values = reference.block_dequantize(codes, scales, ts, bf, axis=-1,
                                      apply_tensor_scale=False)
  return values, (1.0 if ts is None else 1.0 / lax.bitcast_convert_type(ts, jnp.float32))


def q(a, bf, axis: int, rand=None):
  """(the oracle's values of a [R, C] in format `bf` along `axis` (a 2-D tile: both),
  without the tensor scale; 1 / tensor scale, or 1). Along axis 0 it quantizes the
  transpose along its rows (the same blocks, and a 2-D tile's amax is the same)."""
  if axis == 1:
    return _q_rows(a, bf, rand)
  values, inv = _q_rows(a.T, bf, None if rand is None else rand.T)
  return values.T, inv


def oracle(recipe, x, w, g, signs=None, bits=(None, None)):
  """(y, dx, dw) of the formulas above, with the RHT of `signs` (None: no RHT) and SR
  from `bits` (uint32 [M, N] for g's two copies, or None: round to nearest)."""
  roles = recipe.roles()
  qx, sx = q(x, roles.x, 1)
  qw, sw = q(w, roles.w, 0)
  qg, sg = q(g, roles.grad, 1, bits[0])
  qw_n, sw_n = q(w, roles.w, 1)
  y = jnp.dot(qx, qw, precision=HI) * sx * sw
  dx = jnp.dot(qg, qw_n.T, precision=HI) * sg * sw_n
  return y, dx, wgrad(recipe, x, g, signs, signs, bits[1])


def wgrad(recipe, x, g, x_signs, g_signs, bits=None):
  """q(R x, M)^T . q(R g, M) / (S S), each operand rotated where its signs are given."""
  roles = recipe.roles()
  qx, sx = q(x if x_signs is None else rht(x, x_signs), roles.x, 0)
  qg, sg = q(g if g_signs is None else rht(g, g_signs), roles.grad, 0, bits)
  return jnp.dot(qx.T, qg, precision=HI) * sx * sg


# -- the library ------------------------------------------------------------------------


@jax.jit(static_argnums=0)
def library(recipe, x, w, g, key):
  """(y, dx, dw) of `x @ w` run by `mxjax.quantized` under `autocast(recipe)`."""
  f = mxjax.quantized(lambda x, w: x @ w)
  with mxjax.autocast(recipe=recipe):
    y, vjp = jax.vjp(lambda x, w: f(x, w, mx_rng=key), x, w)
  return (y, *vjp(g))


def exact(x, w, g):
  return (jnp.dot(x, w, precision=HI), jnp.dot(g, w.T, precision=HI),
          jnp.dot(x.T, g, precision=HI))


def rel_err(a, b) -> float:
  return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def assert_f32_equal(got, want, what):
  """Equal to f32 accumulation order: within 2^-20 of the largest entry."""
  got, want = np.asarray(got), np.asarray(want)
  np.testing.assert_allclose(got, want, rtol=2 ** -20,
                             atol=2 ** -20 * float(np.abs(want).max()), err_msg=what)


RNE = {  # stochastic rounding off: the oracle, to f32 accumulation order
    "nvfp4": mxjax.NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True),
    "nvfp4_1d": mxjax.NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True,
                                        disable_2d_quantization=True),
    "nvfp4_rht": mxjax.NVFP4BlockScaling(disable_stochastic_rounding=True),
    "fp8_block": mxjax.Float8BlockScaling(),
    "fp8_block_f32_hybrid": mxjax.Float8BlockScaling(use_f32_scales=True,
                                                     fp8_format=mxjax.Format.HYBRID),
    "mxfp4_rht": mxjax.MXFP4BlockScaling(random_hadamard_transform=True),
    "mxfp8_2d_rht": mxjax.MXFP8BlockScaling(enable_2d_quantization=True,
                                           random_hadamard_transform=True),
}


@pytest.mark.parametrize("name", sorted(RNE))
def test_forward_dgrad_wgrad_equal_the_oracle(name):
  recipe = RNE[name]
  x, w, g = data()
  signs = rht_signs(recipe) if recipe.roles().random_hadamard_transform else None
  got = library(recipe, x, w, g, None)
  want = oracle(recipe, x, w, g, signs)
  for what, a, b in zip(("forward", "dgrad", "wgrad"), got, want):
    assert_f32_equal(a, b, f"{name} {what}")
  if signs is not None:  # the RHT changed the wgrad: without it the oracle differs
    assert not np.allclose(got[2], wgrad(recipe, x, g, None, None), rtol=1e-3, atol=1e-3)


# -- stochastic rounding: error bounds against f32 ---------------------------------------

SR = {
    "nvfp4": mxjax.NVFP4BlockScaling(),  # TE's defaults: SR, RHT, 2-D weights
    "mxfp4_sr_rht": mxjax.MXFP4BlockScaling(stochastic_rounding=True,
                                            random_hadamard_transform=True),
    "mxfp4_sr": mxjax.MXFP4BlockScaling(stochastic_rounding=True),
}
# Relative (Frobenius) error of an FP4 gradient against f32 on this data: both FP4
# operands round each element by up to half a step of its block's grid (SR: up to a whole
# step, unbiased), and this data's blocks along M span rows 64x apart in scale; measured
# 0.18 - 0.29 for these recipes (library and oracle alike). A wgrad of one rotated and one
# unrotated operand is another matrix altogether: its error is 1.75 - 1.78.
BOUND = 0.45


def random_bits(seed):
  """uint32 [M, N] drawn here (the oracle's own SR bits)."""
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.integers(0, 2 ** 32, (M, N), dtype=np.uint64).astype(np.uint32))


@pytest.mark.parametrize("name", sorted(SR))
def test_stochastic_rounding_stays_within_the_bound_that_a_one_sided_rht_breaks(name):
  recipe = SR[name]
  x, w, g = data(1)
  rotated = recipe.roles().random_hadamard_transform
  signs = rht_signs(recipe)
  _, want_dx, want_dw = exact(x, w, g)
  y, dx, dw = library(recipe, x, w, g, jax.random.key(3))
  # The forward rounds to nearest: the oracle's, to f32 accumulation order.
  assert_f32_equal(y, oracle(recipe, x, w, g, signs if rotated else None)[0], name)
  assert rel_err(dx, want_dx) < BOUND and rel_err(dw, want_dw) < BOUND, (
      rel_err(dx, want_dx), rel_err(dw, want_dw))
  # Another key: other bits, within the same bound.
  _, dx2, dw2 = library(recipe, x, w, g, jax.random.key(4))
  assert not np.array_equal(dx, dx2) and not np.array_equal(dw, dw2)
  assert max(rel_err(dx2, want_dx), rel_err(dw2, want_dw)) < BOUND
  # The oracle with its own SR bits meets the bound with the RHT on both wgrad operands
  # (or none), and breaks it with the RHT on one operand only.
  bits = random_bits(5)
  both = wgrad(recipe, x, g, signs if rotated else None, signs if rotated else None, bits)
  assert rel_err(both, want_dw) < BOUND
  for x_signs, g_signs in ((signs, None), (None, signs)):
    one_sided = wgrad(recipe, x, g, x_signs, g_signs, bits)
    assert rel_err(one_sided, want_dw) > 1.0 > BOUND, rel_err(one_sided, want_dw)


def test_stochastic_rounding_is_unbiased():
  """SR rounds g up or down with probabilities that make its mean g: the mean over 8 keys
  of the dgrad and the wgrad is much closer to the product of f32 g with the
  round-to-nearest other operand (the oracle's) than one key's is."""
  recipe = SR["mxfp4_sr"]
  roles = recipe.roles()
  x, w, g = data(2)
  qw_n, _ = q(w, roles.w, 1)
  qx_m, _ = q(x, roles.x, 0)
  targets = {1: jnp.dot(g, qw_n.T, precision=HI), 2: jnp.dot(qx_m.T, g, precision=HI)}
  runs = [library(recipe, x, w, g, jax.random.key(k)) for k in range(8)]
  for i, target in targets.items():
    one = rel_err(runs[0][i], target)
    mean = rel_err(sum(r[i] for r in runs) / len(runs), target)
    assert mean < 0.6 * one, (i, mean, one)  # 1 / sqrt(8) = 0.35 for independent noise
