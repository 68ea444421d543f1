"""mxjax.dot_general / matmul: exact against the oracle, numerics, gradients, errors."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import mxjax
from mxjax import reference as ref

HIGHEST = lax.Precision.HIGHEST


def oracle_fake(x, fmt, axes, block_size=32, scale_mode="rceil"):
  """The oracle's quantize-dequantize of `x` in f32, blocks along the flattened `axes`
  (in the given order), as the dot's contraction defines them."""
  axes = tuple(a % x.ndim for a in axes)
  rest = [d for d in range(x.ndim) if d not in axes]
  perm = rest + list(axes)
  xt = jnp.transpose(x, perm)
  flat = xt.reshape(*xt.shape[:len(rest)], -1)
  data, scales = ref.quantize(flat, fmt, axis=-1, block_size=block_size, scale_mode=scale_mode)
  deq = ref.dequantize(data, scales, fmt, axis=-1, block_size=block_size, shape=flat.shape)
  return jnp.transpose(deq.reshape(xt.shape), np.argsort(perm))


def assert_f32_close(out, expected, lhs_abs, rhs_abs, dims):
  """|out - expected| within f32 accumulation-order error of sum |a| |b|."""
  bound = lax.dot_general(lhs_abs, rhs_abs, dims, precision=HIGHEST)
  err = jnp.abs(out.astype(jnp.float32) - expected)
  assert bool(jnp.all(err <= 1e-5 * bound + 1e-30)), float(jnp.max(err - 1e-5 * bound))


LAYOUTS = [
    # (lhs shape, rhs shape, ((lhs contract, rhs contract), (lhs batch, rhs batch)))
    ((64, 96), (96, 48), (((1,), (0,)), ((), ()))),  # plain matmul
    ((96, 64), (96, 48), (((0,), (0,)), ((), ()))),  # transposed lhs
    ((64, 96), (48, 96), (((1,), (1,)), ((), ()))),  # transposed rhs (x @ w.T)
    ((3, 40, 64), (3, 64, 24), (((2,), (1,)), ((0,), (0,)))),  # batched
    ((40, 3, 64), (24, 64, 3), (((2,), (1,)), ((1,), (2,)))),  # batch dims anywhere
    ((8, 6, 16, 5), (16, 6, 7), (((1, 2), (1, 0)), ((), ()))),  # two contracting dims
    ((2, 33, 50), (50, 17), (((2,), (0,)), ((), ()))),  # K and M not multiples of 32
]


@pytest.mark.parametrize("lhs_shape, rhs_shape, dims", LAYOUTS)
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_forward_equals_f32_product_of_oracle_dequantized(lhs_shape, rhs_shape, dims, fmt):
  kl, kr = jax.random.split(jax.random.key(len(lhs_shape) * 7 + lhs_shape[0]))
  lhs = jax.random.normal(kl, lhs_shape, jnp.float32)
  rhs = jax.random.normal(kr, rhs_shape, jnp.float32)
  (lc, rc), _ = dims
  out = jax.jit(functools.partial(mxjax.dot_general, dimension_numbers=dims,
                                  fwd_format=fmt))(lhs, rhs)
  ql, qr = oracle_fake(lhs, fmt, lc), oracle_fake(rhs, fmt, rc)
  expected = lax.dot_general(ql, qr, dims, precision=HIGHEST)
  assert out.shape == lax.dot_general(lhs, rhs, dims).shape
  assert out.dtype == jnp.float32
  assert_f32_close(out, expected, jnp.abs(ql), jnp.abs(qr), dims)


def test_prequantized_operands_are_used_as_is():
  x = jax.random.normal(jax.random.key(0), (32, 96), jnp.bfloat16)
  w = jax.random.normal(jax.random.key(1), (96, 40), jnp.bfloat16)
  expected = mxjax.matmul(x, w)
  w_q = mxjax.quantize(w, "e4m3", axis=0)
  assert bool(jnp.all(mxjax.matmul(x, w_q) == expected))
  x_q = mxjax.quantize(x, "e4m3", axis=1)
  assert bool(jnp.all(mxjax.matmul(x_q, w_q) == expected))
  # A weight quantized ahead of time in another format is not re-quantized to e4m3.
  w_fp4 = mxjax.quantize(w, "e2m1", axis=0)
  out = mxjax.matmul(x, w_fp4, preferred_element_type=jnp.float32)
  exp_fp4 = jnp.dot(oracle_fake(x, "e4m3", (1,)), oracle_fake(w, "e2m1", (0,)), precision=HIGHEST)
  assert_f32_close(out.astype(jnp.float32), exp_fp4, jnp.abs(oracle_fake(x, "e4m3", (1,))),
                   jnp.abs(oracle_fake(w, "e2m1", (0,))), (((1,), (0,)), ((), ())))


def test_prequantized_pair_supplies_the_backward_copy():
  x = jax.random.normal(jax.random.key(0), (64, 96), jnp.float32)
  w = jax.random.normal(jax.random.key(1), (96, 32), jnp.float32)
  pair = mxjax.quantize_2x(w, "e4m3", axes=(0, 1))
  dx_pair = jax.grad(lambda x: mxjax.matmul(x, pair).sum())(x)
  dx_hp = jax.grad(lambda x: mxjax.matmul(x, w).sum())(x)
  assert bool(jnp.all(dx_pair == dx_hp))  # same quantizations, made ahead of time


def test_mxarray_operands_are_constants():
  """Differentiating with respect to an MXArray is refused (E8M0 scales have no zero
  cotangent, so it could only be NaN); closed over, it is a constant, and an output whose
  cotangent is zero (here: only in the aux) needs no backward product."""
  x = jax.random.normal(jax.random.key(0), (64, 96), jnp.float32)
  w = jax.random.normal(jax.random.key(1), (96, 32), jnp.float32)
  w_q = mxjax.quantize(w, "e4m3", axis=0)
  pair = mxjax.quantize_2x(w, "e4m3", axes=(0, 1))
  for weight, name in ((w_q, "rhs"), (pair, "rhs")):
    with pytest.raises(TypeError, match=f"with respect to the MXArray {name}.*constants"):
      jax.grad(lambda v: mxjax.matmul(x, v).sum())(weight)
  with pytest.raises(TypeError, match="with respect to the MXArray lhs"):
    jax.grad(lambda v: mxjax.matmul(v, w).sum())(mxjax.quantize(x, "e4m3", axis=1))
  dx = jax.grad(lambda x: mxjax.matmul(x, pair).sum())(x)
  assert bool(jnp.all(dx == jax.grad(lambda x: mxjax.matmul(x, w).sum())(x)))
  g, aux = jax.grad(lambda x: (jnp.sum(x), mxjax.matmul(x, w)), has_aux=True)(x)
  assert bool(jnp.all(g == 1.0)) and bool(jnp.all(aux == mxjax.matmul(x, w)))


def test_errors_are_clear():
  x = jnp.ones((4, 32), jnp.float32)
  with pytest.raises(ValueError, match="contracting dimension sizes differ"):
    mxjax.dot_general(x, jnp.ones((16, 8)), (((1,), (0,)), ((), ())))
  with pytest.raises(TypeError, match="int32"):
    mxjax.matmul(x, jnp.ones((32, 8), jnp.int32))
  w_q = mxjax.quantize(jnp.ones((32, 64)), axis=1)  # quantized along N, not K
  with pytest.raises(ValueError, match="quantized along axis 1"):
    mxjax.matmul(x, w_q)
  with pytest.raises(ValueError, match="block_size"):
    mxjax.matmul(x, jnp.ones((32, 8)), block_size=48)


@pytest.mark.parametrize("a_shape,b_shape", [
    ((2, 5, 64), (1, 64, 7)), ((2, 3, 5, 64), (3, 64, 7)), ((5, 64), (2, 64, 7)),
    ((1, 5, 64), (2, 64, 7)), ((5, 64), (64,)), ((64,), (64,)), ((64,), (2, 64, 7)),
    ((2, 5, 64), (64,))])
def test_matmul_takes_jnp_matmul_shapes(a_shape, b_shape):
  """Broadcast batch dims and vector operands: jnp.matmul's output shape, the values and
  gradients of the MX product of the operands broadcast by hand (jnp.matmul's meaning)."""
  a = jax.random.normal(jax.random.key(0), a_shape)
  b = jax.random.normal(jax.random.key(1), b_shape)
  as_matrices = lambda a, b: (a[None] if a.ndim == 1 else a,  # noqa: E731
                               b[:, None] if b.ndim == 1 else b)

  def by_hand(a, b):
    a2, b2 = as_matrices(a, b)
    batch = jnp.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    a2 = jnp.broadcast_to(a2, batch + a2.shape[-2:])
    b2 = jnp.broadcast_to(b2, batch + b2.shape[-2:])
    n = len(batch)
    y = mxjax.dot_general(a2, b2, (((n + 1,), (n,)), (tuple(range(n)),) * 2))
    return y.reshape(jnp.matmul(a, b).shape)

  y = mxjax.matmul(a, b)
  assert y.shape == jnp.matmul(a, b).shape
  np.testing.assert_array_equal(y, by_hand(a, b))
  exact = jnp.matmul(a, b, precision=HIGHEST)
  assert float(jnp.linalg.norm(y - exact) / jnp.linalg.norm(exact)) < 0.06  # E4M3
  loss = lambda f: lambda a, b: jnp.sum(jnp.sin(f(a, b)))  # noqa: E731
  for got, want in zip(jax.grad(loss(mxjax.matmul), (0, 1))(a, b),
                       jax.grad(loss(by_hand), (0, 1))(a, b), strict=True):
    np.testing.assert_array_equal(got, want)


def test_matmul_shapes_it_cannot_take_are_named():
  x = jnp.ones((2, 5, 64))
  with pytest.raises(ValueError, match="rank >= 1"):
    mxjax.matmul(x, jnp.float32(2.0))
  with pytest.raises(ValueError, match="do not broadcast"):
    mxjax.matmul(x, jnp.ones((3, 64, 7)))
  with pytest.raises(ValueError, match="only arrays"):
    mxjax.matmul(x, mxjax.quantize(jnp.ones((1, 64, 7)), axis=1))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_dtypes(dtype):
  x = jnp.ones((8, 32), dtype)
  w = jnp.ones((32, 16), dtype)
  assert mxjax.matmul(x, w).dtype == dtype
  assert mxjax.matmul(x, w, preferred_element_type=jnp.float32).dtype == jnp.float32
  dx, dw = jax.grad(lambda x, w: mxjax.matmul(x, w).astype(jnp.float32).sum(), (0, 1))(x, w)
  assert dx.dtype == dtype and dw.dtype == dtype
  assert bool(jnp.all(mxjax.matmul(x, w) == 32))


@pytest.mark.parametrize("out_dtype", ["float8_e4m3fn", "float64"])
def test_gradient_of_an_output_dtype_mx_cannot_quantize(out_dtype):
  """preferred_element_type f64 (under x64) or FP8, as `lax.dot_general` takes it: the
  cotangent of that dtype is widened to f32 for the backward's quantizer, so the gradients
  equal those of an f32 output fed the same cotangent (before: quantize_2x's TypeError)."""
  x = jax.random.normal(jax.random.key(0), (8, 64))
  w = jax.random.normal(jax.random.key(1), (64, 16))
  g = jnp.round(jax.random.normal(jax.random.key(2), (8, 16)) * 4) / 4  # exact in FP8
  with jax.enable_x64(out_dtype == "float64"):
    def grads(dtype):
      out, vjp = jax.vjp(lambda x, w: mxjax.matmul(x, w, preferred_element_type=dtype), x, w)
      assert out.dtype == jnp.dtype(dtype)
      return vjp(g.astype(dtype))
    got, want = grads(jnp.dtype(out_dtype)), grads(jnp.float32)
  for a, b in zip(got, want, strict=True):
    assert a.dtype == jnp.float32
    np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------------------
# Gradients: the straight-through definition, computed with the oracle.


def straight_through_grads(x, w, g, fwd="e4m3", bwd="e5m2"):
  """dgrad = q(g, N) . q(w, N);  wgrad = q(x, M)^T . q(g, M)  (x [M, K], w [K, N])."""
  dx = jnp.dot(oracle_fake(g, bwd, (1,)), oracle_fake(w, fwd, (1,)).T, precision=HIGHEST)
  dw = jnp.dot(oracle_fake(x, fwd, (0,)).T, oracle_fake(g, bwd, (0,)), precision=HIGHEST)
  return dx, dw


@pytest.mark.parametrize("shape", [(64, 96, 48), (50, 70, 33)])
def test_grads_are_the_straight_through_definition(shape):
  m, k, n = shape
  kx, kw, kg = jax.random.split(jax.random.key(m), 3)
  x = jax.random.normal(kx, (m, k), jnp.float32)
  w = jax.random.normal(kw, (k, n), jnp.float32)
  g = jax.random.normal(kg, (m, n), jnp.float32)
  loss = lambda x, w: jnp.sum(mxjax.matmul(x, w) * g)
  dx, dw = jax.jit(jax.grad(loss, (0, 1)))(x, w)
  ex, ew = straight_through_grads(x, w, g)
  assert_f32_close(dx, ex, jnp.abs(g), jnp.abs(w).T, (((1,), (0,)), ((), ())))
  assert_f32_close(dw, ew, jnp.abs(x).T, jnp.abs(g), (((1,), (0,)), ((), ())))


def test_vmap_equals_per_example_loop_forward_and_grad():
  x = jax.random.normal(jax.random.key(3), (3, 40, 64), jnp.float32)
  w = jax.random.normal(jax.random.key(4), (64, 24), jnp.float32)
  f = lambda x, w: jnp.sum(mxjax.matmul(x, w) ** 2)
  vals, grads = jax.vmap(jax.value_and_grad(f, (0, 1)), in_axes=(0, None))(x, w)
  for i in range(3):
    v, (gx, gw) = jax.value_and_grad(f, (0, 1))(x[i], w)
    np.testing.assert_allclose(vals[i], v, rtol=1e-6)
    np.testing.assert_array_equal(grads[0][i], gx)
    np.testing.assert_allclose(grads[1][i], gw, rtol=1e-6, atol=1e-6)


def test_unaligned_shapes_equal_zero_padded_computation():
  x = jax.random.normal(jax.random.key(5), (50, 70), jnp.float32)
  w = jax.random.normal(jax.random.key(6), (70, 40), jnp.float32)
  xp = jnp.pad(x, ((0, 14), (0, 26)))  # M 50 -> 64, K 70 -> 96
  wp = jnp.pad(w, ((0, 26), (0, 24)))  # N 40 -> 64
  f = lambda x, w: jnp.sum(jnp.sin(mxjax.matmul(x, w)))
  out, (dx, dw) = jax.value_and_grad(f, (0, 1))(x, w)
  # The padded loss differs only by sin(0) = 0 terms; its grads, sliced, are the same.
  out_p, (dxp, dwp) = jax.value_and_grad(f, (0, 1))(xp, wp)
  np.testing.assert_allclose(out, out_p, rtol=1e-5)
  np.testing.assert_allclose(dx, dxp[:50, :70], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dw, dwp[:70, :40], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------
# Numerics against the unquantized product.


def rel_frobenius(a, b):
  a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def test_error_vs_unquantized_on_normal_data():
  """Measured on N(0, 1) operands with 32-blocks (RCEIL): forward E4M3 ~3.75%, dgrad and
  wgrad with E5M2 gradients ~5.9%. Each quantized operand carries ~2.65% (E4M3) or
  ~5.3% (E5M2) RMS relative error, and a product of two independently quantized
  operands adds them in quadrature: sqrt(2) * 2.65% = 3.75% is the floor for an E4M3
  forward on Gaussian data, so the bound here is 4%, not 3%."""
  kx, kw, kg = jax.random.split(jax.random.key(7), 3)
  x = jax.random.normal(kx, (256, 512), jnp.float32)
  w = jax.random.normal(kw, (512, 256), jnp.float32)
  g = jax.random.normal(kg, (256, 256), jnp.float32)
  out, vjp = jax.vjp(mxjax.matmul, x, w)
  dx, dw = vjp(g)
  assert rel_frobenius(out, jnp.dot(x, w, precision=HIGHEST)) <= 0.04
  assert rel_frobenius(dx, jnp.dot(g, w.T, precision=HIGHEST)) <= 0.06
  assert rel_frobenius(dw, jnp.dot(x.T, g, precision=HIGHEST)) <= 0.06


def test_format_error_order():
  """Forward error by element format, on N(0, 1) data (measured): e2m1 ~16% > e3m2 ~
  e5m2 ~7.5% (two mantissa bits) > e2m3 ~4.0% > e4m3 ~3.75% (three mantissa bits; e4m3
  also keeps small elements of a block as normals)."""
  x = jax.random.normal(jax.random.key(8), (256, 512), jnp.float32)
  w = jax.random.normal(jax.random.key(9), (512, 256), jnp.float32)
  exact = jnp.dot(x, w, precision=HIGHEST)
  err = {f: rel_frobenius(mxjax.matmul(x, w, fwd_format=f), exact)
         for f in ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")}
  assert err["e2m1"] > 2 * max(err["e3m2"], err["e5m2"])
  assert min(err["e3m2"], err["e5m2"]) > 1.5 * err["e2m3"]
  assert err["e2m3"] > err["e4m3"]
  assert math.isclose(err["e3m2"], err["e5m2"], rel_tol=0.1)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_a_transposed_result_runs(dtype):
  """XLA folds a transpose of the result into the dot (swapping its operands); the
  product must still run (bf16 x bf16 -> f32 dots fail in that layout on CPU)."""
  x = jax.random.normal(jax.random.key(0), (40, 96), dtype)
  w = jax.random.normal(jax.random.key(1), (96, 24), dtype)
  out = jax.jit(lambda x, w: mxjax.matmul(x, w, preferred_element_type=jnp.float32).T)(x, w)
  qx = oracle_fake(x.astype(jnp.float32), "e4m3", (1,))
  qw = oracle_fake(w.astype(jnp.float32), "e4m3", (0,))
  assert out.shape == (24, 40)
  assert_f32_close(out.T, jnp.dot(qx, qw, precision=HIGHEST), jnp.abs(qx), jnp.abs(qw),
                   (((1,), (0,)), ((), ())))
