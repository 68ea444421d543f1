"""Every input-validation error of quantize / quantize_2x / dequantize names what was
wrong, and fake_quantize is quantize-dequantize with a straight-through gradient."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mxjax
from mxjax import reference
from mxjax._src import fp8

X = jnp.ones((4, 64), jnp.float32)

QUANTIZE_ERRORS = [
    # (kwargs for quantize, x, error type, message pattern)
    (dict(), jnp.ones((4, 64), jnp.int32), TypeError,
     r"bfloat16, float16 or float32.*integer.*int32"),
    (dict(), jnp.ones((4, 64), jnp.complex64), TypeError, r"complex.*complex64"),
    (dict(), jnp.ones((4, 64), jnp.bool_), TypeError, r"unsupported.*bool"),
    (dict(), jnp.float32(1.0), ValueError, r"rank >= 1.*scalar"),
    (dict(axis=2), X, ValueError, r"axis 2 is out of range.*rank 2"),
    (dict(axis=-3), X, ValueError, r"axis -3 is out of range"),
    (dict(axis=1.0), X, ValueError, r"axis 1.0"),
    (dict(block_size=8), X, ValueError, r"block_size 8 is not supported.*\(16, 32, 64\)"),
    (dict(block_size=32.0), X, TypeError, r"block_size must be an int, got 32.0"),
    (dict(block_size=True), X, TypeError, r"block_size must be an int, got True"),
    (dict(format="e4m4"), X, ValueError, r"Unknown MX element format 'e4m4'.*e2m1"),
    (dict(format=8), X, TypeError, r"format must be a string or ElementFormat, got 8"),
    (dict(scale_mode="ceil"), X, ValueError, r"Unknown scale mode 'ceil'.*rceil.*floor"),
]


@pytest.mark.parametrize("kwargs, x, error, message", QUANTIZE_ERRORS)
def test_quantize_errors(kwargs, x, error, message):
  kwargs = {"format": "e4m3", **kwargs}
  with pytest.raises(error, match=message):
    mxjax.quantize(x, **kwargs)
  if "axis" not in kwargs:  # the same checks guard quantize_2x and fake_quantize
    if x.ndim >= 2:
      with pytest.raises(error, match=message.replace("rank >= 1", "rank >= 2")):
        mxjax.quantize_2x(x, **kwargs)
    with pytest.raises(error, match=message):
      mxjax.fake_quantize(x, **kwargs)


def test_quantize_2x_errors():
  with pytest.raises(ValueError, match=r"rank >= 2; got shape \(64,\)"):
    mxjax.quantize_2x(jnp.ones(64))
  with pytest.raises(ValueError, match=r"two distinct axes; got \(1, -1\)"):
    mxjax.quantize_2x(X, axes=(1, -1))
  with pytest.raises(ValueError, match=r"axis 2 is out of range"):
    mxjax.quantize_2x(X, axes=(0, 2))
  with pytest.raises(TypeError, match=r"integer array of dtype int8"):
    mxjax.quantize_2x(X.astype(jnp.int8))


def test_dequantize_errors():
  a = mxjax.quantize(X, "e2m1")
  with pytest.raises(TypeError, match=r"needs an MXArray, got ArrayImpl"):
    mxjax.dequantize(X)
  with pytest.raises(TypeError, match=r"bfloat16, float16 or float32, not int32"):
    mxjax.dequantize(a, jnp.int32)
  with pytest.raises(TypeError, match=r"not float64"):
    mxjax.dequantize(a, np.float64)
  with pytest.raises(ValueError, match=r"MXArray: data \(4, 32\) and scales \(4, 1\) do not "
                                       r"fit e2m1/e8m0/1x32 quantized along axis -1 \(from the end\) of "
                                       r"length 64 in blocks of 32"):
    dataclasses.replace(a, scales=a.scales[:, :1])
  with pytest.raises(ValueError, match=r"data \(4, 16\) and scales \(4, 2\) do not fit"):
    dataclasses.replace(a, data=a.data[:, :16])
  wrong_dtype = dataclasses.replace(a, data=a.data.astype(jnp.int8))
  with pytest.raises(ValueError, match=r"data is int8\[4, 32\].*needs uint8\[4, 32\]"):
    mxjax.dequantize(wrong_dtype)
  with pytest.raises(ValueError, match=r"Unknown MX element format 'e9m9'"):
    mxjax.dequantize(dataclasses.replace(a, format="e9m9"))


def test_vmap_axes_after_the_quantized_axis_are_named():
  """An MXArray counts its quantized axis from the end, so only leading vmap axes keep its
  metadata true. A mapped axis at or after it is a ValueError that says so: as in_axes (was
  an IndexError) and as out_axes (was an MXArray describing another tensor, which failed
  only at its dequantize). Leading axes give the per-member results."""
  ws = jax.random.normal(jax.random.key(0), (3, 64, 16))
  q = mxjax.quantize(jnp.moveaxis(ws, 0, 2), axis=0)  # [64, 16, 3], the members last
  with pytest.raises(ValueError, match="mapped axis at or after the quantized axis"):
    jax.vmap(lambda q: q.dequantize(), in_axes=2)(q)
  with pytest.raises(ValueError, match="mapped axis at or after the quantized axis"):
    jax.vmap(lambda w: mxjax.quantize(w, axis=0), out_axes=2)(ws)
  stacked = jax.vmap(lambda w: mxjax.quantize(w, axis=0), out_axes=0)(ws)
  assert stacked.shape == (3, 64, 16) and stacked.axis == 1
  for i in range(3):
    np.testing.assert_array_equal(stacked.dequantize()[i],
                                  mxjax.quantize(ws[i], axis=0).dequantize())


# ---------------------------------------------------------------------------------------
# fake_quantize


@pytest.mark.parametrize("fmt, axis, block_size, mode, dtype", [
    ("e4m3", -1, 32, "rceil", jnp.bfloat16), ("e5m2", 0, 16, "floor", jnp.float32),
    ("e3m2", 1, 64, "rceil", jnp.float16), ("e2m1", 0, 32, "floor", jnp.bfloat16)])
def test_fake_quantize_value_and_straight_through_gradient(fmt, axis, block_size, mode, dtype):
  x = (jax.random.normal(jax.random.key(1), (48, 80), jnp.float32) * 3).astype(dtype)
  kwargs = dict(axis=axis, block_size=block_size, scale_mode=mode)
  got = jax.jit(lambda v: mxjax.fake_quantize(v, fmt, **kwargs))(x)
  data, scales = reference.quantize(x, fmt, **kwargs)
  want = reference.dequantize(data, scales, fmt, axis=axis, block_size=block_size,
                              shape=x.shape, dtype=dtype)
  assert got.dtype == x.dtype
  np.testing.assert_array_equal(np.asarray(got).view(np.uint16 if dtype != jnp.float32 else
                                                     np.uint32),
                                np.asarray(want).view(np.uint16 if dtype != jnp.float32 else
                                                      np.uint32))
  assert not np.array_equal(np.asarray(got, np.float32), np.asarray(x, np.float32))
  # The gradient is the identity's: cotangents pass through unchanged, bit for bit.
  ct = jax.random.normal(jax.random.key(2), x.shape, jnp.float32).astype(dtype)
  _, vjp = jax.vjp(lambda v: mxjax.fake_quantize(v, fmt, **kwargs), x)
  (grad,) = vjp(ct)
  assert grad.dtype == x.dtype
  np.testing.assert_array_equal(np.asarray(grad, np.float32), np.asarray(ct, np.float32))
  g = jax.grad(lambda v: jnp.sum(mxjax.fake_quantize(v, fmt, **kwargs).astype(jnp.float32)
                                 * 3.0))(x)
  np.testing.assert_array_equal(np.asarray(g, np.float32), 3.0)


@pytest.mark.parametrize("to_array", [np.asarray, jnp.asarray, np.array, jnp.array])
def test_mxarray_to_array_names_dequantize(to_array):
  """An MXArray has no implicit array value (numpy would make a 0-d object array)."""
  mx = mxjax.quantize(X, "e4m3")
  with pytest.raises(TypeError, match=r"block-scaled.*\.dequantize\(dtype\)"):
    to_array(mx)


NO_DERIVATIVE = [
    ("mxjax.quantize", lambda x: mxjax.quantize(x, "e2m1").dequantize()),
    ("mxjax.quantize_2x", lambda x: mxjax.quantize_2x(x, "e3m2")[1].dequantize()),
    ("mxjax.dequantize",  # an MXArray whose arrays depend on x
     lambda x: dataclasses.replace(mxjax.quantize(jax.lax.stop_gradient(x)),
                                   data=x.astype(jnp.float8_e4m3fn)).dequantize()),
    ("mxjax.quantize_2x", lambda x: jax.grad(  # second order through the MX product
        lambda w: mxjax.matmul(X, w).sum())(x)),
    ("mxjax.fake_quantize's quantizer", lambda x: jax.grad(  # second order through QAT
        lambda y: jnp.sum(mxjax.fake_quantize(y) ** 3))(x)),
    ("mxjax's per-tensor FP8 product's gradient", lambda x: jax.grad(  # was an all-NaN Hessian
        lambda w: jnp.sum(fp8.dot_general(X, w, (((1,), (0,)), ((), ())),
                                          mxjax.Float8CurrentScaling(), None)[0] ** 2))(x)),
]


@pytest.mark.parametrize("name, fn", NO_DERIVATIVE)
@pytest.mark.parametrize("jit", [False, True])
def test_differentiating_the_codec_names_the_alternatives(name, fn, jit):
  """grad through quantize / dequantize (or twice through a product) is a TypeError that
  points to fake_quantize and stop_gradient, not JAX's custom_partitioning message; twice
  through fake_quantize, one that says its gradient is its only derivative."""
  grad = jax.grad(lambda x: jnp.sum(fn(x)))
  hint = ("straight-through gradient is its one derivative.*second derivative"
          if name.startswith("mxjax.fake_quantize") else "fake_quantize.*stop_gradient")
  with pytest.raises(TypeError, match=rf"{name} has no derivative.*{hint}"):
    (jax.jit(grad) if jit else grad)(jnp.ones((64, 64), jnp.float32))


def test_codec_of_a_stopped_gradient_is_a_constant():
  """The codec's JVP rule only fires for inputs being differentiated."""
  x = jax.random.normal(jax.random.key(0), (4, 64))
  f = lambda x: jnp.sum(x * mxjax.quantize(jax.lax.stop_gradient(x)).dequantize())  # noqa: E731
  np.testing.assert_array_equal(jax.grad(f)(x), mxjax.quantize(x).dequantize())
