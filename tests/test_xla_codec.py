"""The plain-XLA codec (mxjax._src.codec) equals the oracle bit for bit, in this process; and
through the public ops under MXJAX_KERNELS=xla it shards as the FFI path does."""

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import mxjax
from conftest import (DTYPES, FORMAT_NAMES, SCALE_MODES, all_bf16_patterns, all_f16_patterns,
                      bits_of, every_code_under_every_scale, f32_patterns, float_arrays,
                      shapes_and_axes, special_blocks)
from mxjax import reference
from mxjax._src import backend, codec, float_bits, formats


def u8(a):
  return np.asarray(a).view(np.uint8)


def codec_quantize(x, fmt, axis, block_size, mode):
  f = formats.mx(fmt, block_size, mode)
  return jax.jit(lambda v: codec.quantize(v, f, axis % v.ndim)[:2])(x)


def codec_dequantize(data, scales, fmt, axis, block_size, length, dtype):
  f = formats.mx(fmt, block_size)
  return jax.jit(lambda d, s: codec.dequantize(d, s, None, f, axis % d.ndim, length,
                                               dtype))(data, scales)


def assert_equals_oracle(x, fmt, axis, block_size, mode, dtypes=DTYPES):
  data, scales = codec_quantize(x, fmt, axis, block_size, mode)
  want = reference.quantize(x, fmt, axis=axis, block_size=block_size, scale_mode=mode)
  np.testing.assert_array_equal(u8(scales), u8(want[1]))
  np.testing.assert_array_equal(u8(data), u8(want[0]))
  assert data.dtype == want[0].dtype and data.shape == want[0].shape
  for dtype in dtypes:  # bit for bit, NaN payloads included
    got = codec_dequantize(*want, fmt, axis, block_size, x.shape[axis], dtype)
    np.testing.assert_array_equal(
        bits_of(got), bits_of(reference.dequantize(*want, fmt, axis=axis, block_size=block_size,
                                                   shape=x.shape, dtype=dtype)))


def test_widening_and_narrowing_equal_the_oracle():
  for x in (all_bf16_patterns(), all_f16_patterns(), f32_patterns(256)):
    x = jnp.asarray(x)
    np.testing.assert_array_equal(float_bits.f32_bits(x), reference.to_f32_bits(x))
  bits = jnp.asarray(np.random.default_rng(0).integers(0, 1 << 32, 1 << 16, np.uint64)
                     .astype(np.uint32))
  bits = jnp.concatenate([bits, reference.to_f32_bits(jnp.asarray(all_bf16_patterns()))
                          .ravel() + 0x8000])  # halfway cases
  for dtype in DTYPES:
    np.testing.assert_array_equal(bits_of(float_bits.from_f32_bits(bits, dtype)),
                                  bits_of(reference.from_f32_bits(bits, dtype)))


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_every_bit_pattern_rowwise_and_columnwise(fmt):
  bf16 = np.concatenate([all_bf16_patterns(), all_bf16_patterns("strided"),
                         special_blocks(ml_dtypes.bfloat16, 32)])
  f16 = np.concatenate([all_f16_patterns(), special_blocks(np.float16, 32)])
  f32 = np.concatenate([f32_patterns(512), special_blocks(np.float32, 32)])
  for mode in SCALE_MODES:
    for x in (bf16, f16, f32):
      x = jnp.asarray(x)
      for axis in (1, 0):
        assert_equals_oracle(x, fmt, axis, 32, mode, dtypes=DTYPES if axis else ())
    for block_size in (16, 64):
      assert_equals_oracle(jnp.asarray(bf16.reshape(-1, 64)), fmt, 1, block_size, mode, ())


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_dequantize_every_code_under_every_scale(fmt):
  codes, scales, data = every_code_under_every_scale(fmt)
  for dtype in DTYPES:
    got = codec_dequantize(data, scales, fmt, -1, 32, codes.shape[1], dtype)
    want = reference.dequantize(data, scales, fmt, block_size=32, shape=codes.shape,
                                dtype=dtype)
    np.testing.assert_array_equal(bits_of(got), bits_of(want))


@given(shape_axis=shapes_and_axes(), fmt=st.sampled_from(FORMAT_NAMES),
       mode=st.sampled_from(SCALE_MODES), dtype=st.sampled_from(DTYPES), data=st.data())
def test_random_shapes_and_axes(shape_axis, fmt, mode, dtype, data):
  shape, axis = shape_axis
  x = jnp.asarray(data.draw(float_arrays(shape, dtype)))
  block_size = data.draw(st.sampled_from(formats.BLOCK_SIZES))
  assert_equals_oracle(x, fmt, axis, block_size, mode, dtypes=(data.draw(st.sampled_from(DTYPES)),))


# ---------------------------------------------------------------------------------------
# Through the public ops, sharded


@pytest.fixture
def xla_kernels():
  before = backend.get_kernels()
  backend.set_kernels("xla")
  yield
  backend.set_kernels(before)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (CPU) devices")
@pytest.mark.parametrize("fmt", ["e4m3", "e2m3", "e2m1"])
def test_xla_path_shards_without_collectives(xla_kernels, fmt):
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
  x = jax.random.normal(jax.random.key(0), (256, 512), jnp.bfloat16) * 3
  spec = P("data", "model")
  xs = jax.device_put(x, NamedSharding(mesh, spec))
  f = jax.jit(lambda v: mxjax.quantize_2x(v, fmt))
  text = f.lower(xs).compile().as_text()
  assert not re.search(r"all-gather|all-to-all|collective-permute|all-reduce", text)
  assert "mxjax_" not in text
  rows, cols = f(xs)
  for a, axis in ((rows, 1), (cols, 0)):
    data, scales = reference.quantize(x, fmt, axis=axis)
    np.testing.assert_array_equal(u8(a.data), u8(data))
    np.testing.assert_array_equal(u8(a.scales), u8(scales))
    assert a.data.sharding.is_equivalent_to(NamedSharding(mesh, spec), 2)
  g = jax.jit(lambda a: a.dequantize(jnp.bfloat16))
  y = g(rows)
  assert y.sharding.is_equivalent_to(NamedSharding(mesh, spec), 2)
  assert not re.search(r"all-gather|all-to-all|collective-permute", g.lower(rows).compile()
                       .as_text())
  np.testing.assert_array_equal(bits_of(y), bits_of(reference.dequantize(
      *reference.quantize(x, fmt), fmt, shape=x.shape, dtype=jnp.bfloat16)))


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("shape,axis", [((0, 64), 1), ((0, 64), 0), ((4, 0), 0), ((4, 0), 1),
                                        ((3, 0, 40), 2)])
def test_zero_length_dims_on_every_path(fmt, shape, axis):
  """An empty array quantizes to the oracle's empty data and scales on the XLA path and
  through the public op (the FFI kernels on CPU), and dequantizes back to its shape."""
  x = jnp.zeros(shape, jnp.bfloat16)
  assert_equals_oracle(x, fmt, axis, 32, "rceil", dtypes=(jnp.bfloat16,))
  want_data, want_scales = reference.quantize(x, fmt, axis=axis)
  q = mxjax.quantize(x, fmt, axis=axis)
  assert (q.data.shape, q.scales.shape) == (want_data.shape, want_scales.shape)
  assert q.dequantize(jnp.float32).shape == shape
