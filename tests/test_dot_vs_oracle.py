"""mxjax.dot_general's gradients and its exactness bound, against products of the oracle's
dequantized operands (jax's own dot_general and its transpose do the arithmetic)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import mxjax
from test_dot import HIGHEST, oracle_fake

# The smallest normal f32: an operand element below it is flushed in XLA CPU's dot.
F32_TINY = 2.0 ** -126


def _free(ndim, contract, batch):
  return tuple(d for d in range(ndim) if d % ndim not in {c % ndim for c in (*contract, *batch)})


def straight_through_grads(lhs, rhs, g, dims, fwd, bwd, block_size, mode):
  """(dlhs, drhs, bounds): dlhs = q(g, N) . q(rhs, N), drhs = q(lhs, M) . q(g, M), with the
  free dims flattened in order as the blocked axis; as the transpose of the linear map
  `dot_general` (jax.vjp), in f32; bounds are the same with |.| of every factor."""
  (lc, rc), (lb, _) = dims
  lfree, rfree = _free(lhs.ndim, lc, lb), _free(rhs.ndim, rc, dims[1][1])
  g_m = tuple(range(len(lb), len(lb) + len(lfree)))
  g_n = tuple(range(len(lb) + len(lfree), g.ndim))
  q = functools.partial(oracle_fake, block_size=block_size, scale_mode=mode)
  g_qn, g_qm = q(g, bwd, g_n), q(g, bwd, g_m)
  rhs_qn, lhs_qm = q(rhs, fwd, rfree), q(lhs, fwd, lfree)
  dot = functools.partial(lax.dot_general, dimension_numbers=dims, precision=HIGHEST)

  def transposed(a, b, ct):
    return (jax.vjp(lambda l: dot(l, b), a)[1](ct)[0], jax.vjp(lambda r: dot(a, r), b)[1](ct)[0])

  dlhs = transposed(lhs, rhs_qn, g_qn)[0]
  drhs = transposed(lhs_qm, rhs, g_qm)[1]
  bound_l = transposed(lhs, jnp.abs(rhs_qn), jnp.abs(g_qn))[0]
  bound_r = transposed(jnp.abs(lhs_qm), rhs, jnp.abs(g_qm))[1]
  return dlhs, drhs, bound_l, bound_r


def assert_within(got, want, bound):
  """|got - want| within f32 accumulation-order error of the sum of |terms|."""
  err = jnp.abs(got.astype(jnp.float32) - want)
  assert bool(jnp.all(err <= 1e-5 * bound + 1e-30)), float(jnp.max(err - 1e-5 * bound))


MATMUL = ((64, 96), (96, 48), (((1,), (0,)), ((), ())))
CASES = [
    # (name, lhs shape, rhs shape, dims, fwd, bwd, block size, scale mode)
    ("batched", (3, 40, 64), (3, 64, 24), (((2,), (1,)), ((0,), (0,))), "e4m3", "e5m2", 32,
     "rceil"),
    ("batch_dims_anywhere", (40, 3, 64), (24, 64, 3), (((2,), (1,)), ((1,), (2,))), "e4m3",
     "e5m2", 32, "rceil"),
    ("transposed_lhs", (96, 64), (96, 48), (((0,), (0,)), ((), ())), "e4m3", "e5m2", 32,
     "rceil"),
    ("two_contracting", (8, 6, 16, 5), (16, 6, 7), (((1, 2), (1, 0)), ((), ())), "e4m3",
     "e5m2", 32, "rceil"),
    ("ragged", (2, 33, 50), (50, 17), (((2,), (0,)), ((), ())), "e4m3", "e5m2", 32, "rceil"),
    ("floor", *MATMUL, "e4m3", "e5m2", 32, "floor"),
    ("block16", *MATMUL, "e4m3", "e5m2", 16, "rceil"),
    ("block64", *MATMUL, "e4m3", "e5m2", 64, "rceil"),
    ("fp6", *MATMUL, "e3m2", "e2m3", 32, "rceil"),
    ("fp4", *MATMUL, "e2m1", "e2m1", 32, "floor"),
]


@pytest.mark.parametrize("name, lhs_shape, rhs_shape, dims, fwd, bwd, block_size, mode", CASES,
                         ids=[c[0] for c in CASES])
def test_gradients_equal_products_of_oracle_dequantized(name, lhs_shape, rhs_shape, dims, fwd,
                                                        bwd, block_size, mode):
  kl, kr, kg = jax.random.split(jax.random.key(len(name)), 3)
  lhs = jax.random.normal(kl, lhs_shape, jnp.float32)
  rhs = jax.random.normal(kr, rhs_shape, jnp.float32) * 4
  g = jax.random.normal(kg, lax.dot_general(lhs, rhs, dims).shape, jnp.float32) / 3
  f = functools.partial(mxjax.dot_general, dimension_numbers=dims, fwd_format=fwd,
                        bwd_format=bwd, block_size=block_size, scale_mode=mode)
  out, vjp = jax.vjp(f, lhs, rhs)
  dlhs, drhs = jax.jit(vjp)(g)
  want_l, want_r, bound_l, bound_r = straight_through_grads(lhs, rhs, g, dims, fwd, bwd,
                                                            block_size, mode)
  assert dlhs.shape == lhs.shape and drhs.shape == rhs.shape
  assert_within(dlhs, want_l, bound_l)
  assert_within(drhs, want_r, bound_r)


# ---------------------------------------------------------------------------------------
# The exactness bound


def test_product_is_exact_down_to_the_smallest_normal_f32_and_bounded_below():
  """The dot multiplies dequantized f32 operands with f32 accumulation. An element whose
  dequantized magnitude is at least 2^-126 enters exactly; a smaller one (an E4M3 element
  under a scale near 2^-127) may be lost: XLA's CPU flushes f32 subnormals. So
  |dot - exact| <= sum over such elements of |a_k| |b_k|."""
  k = np.arange(32, dtype=np.float32)
  normal = (k % 7 - 3) / 4  # E4M3 values; products and sums exact in f32
  tiny = (k % 5 + 1) * 2.0 ** -132  # one block whose scale is clamped to 2^-127
  lhs = jnp.asarray(np.concatenate([normal, tiny.astype(np.float32)])[None, :])
  rhs = jnp.asarray(np.concatenate([np.full(32, 2.0), np.full(32, 2.0 ** 110)])[:, None],
                    jnp.float32)
  out = float(mxjax.matmul(lhs, rhs)[0, 0])
  a = np.asarray(oracle_fake(lhs, "e4m3", (1,)), np.float64)[0]
  b = np.asarray(oracle_fake(rhs, "e4m3", (0,)), np.float64)[:, 0]
  assert (np.abs(a[32:]) < F32_TINY).all()
  assert ((np.abs(a[:32]) >= F32_TINY) | (a[:32] == 0)).all()
  exact = float(np.dot(a, b))
  flushed = float(np.dot(np.abs(a[32:]), np.abs(b[32:])))
  assert flushed > 2.0 ** -30  # the bound is not vacuous here: ~2^-20 of a result of ~1
  assert abs(out - exact) <= flushed
  assert out == float(np.dot(a[:32], b[:32])) or jax.default_backend() != "cpu"
  # All elements >= 2^-126: exact.
  big = jnp.concatenate([lhs[:, :32], lhs[:, :32] * 2.0 ** -100], axis=1)
  a = np.asarray(oracle_fake(big, "e4m3", (1,)), np.float64)[0]
  assert (np.abs(a[a != 0]) >= F32_TINY).all()
  assert float(mxjax.matmul(big, rhs)[0, 0]) == float(np.dot(a, b))
