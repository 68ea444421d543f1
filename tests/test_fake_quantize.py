"""fake_quantize (one fused kernel pass on the CPU) equals the oracle's quantize then
dequantize bit for bit, at every CPU kernel level (conftest's `simd_level`), and it is what
a product without backward runs: one kernel call per operand, no MX array in memory."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

from conftest import (DTYPE_IDS, DTYPES, FORMAT_NAMES, SCALE_MODES, assert_same_floats,
                      exhaustive_rows, float_arrays, shapes_and_axes, wide_mixed_blocks)
import mxjax
from mxjax import reference
from mxjax._src import backend, extension

pytestmark = pytest.mark.usefixtures("simd_level")

needs_cpu_kernels = pytest.mark.skipif("cpu" not in backend.ffi_platforms(),
                                       reason="the CPU kernels are not built or not in use")


def oracle(x, fmt, axis, dtype, block_size=32, mode="rceil"):
  """The oracle's dequantize(quantize(x)) of `dtype`."""
  data, scales = reference.quantize(x, fmt, axis=axis, block_size=block_size, scale_mode=mode)
  return reference.dequantize(data, scales, fmt, axis=axis, block_size=block_size,
                              shape=x.shape, dtype=dtype)


@pytest.mark.parametrize("dtype_id", DTYPE_IDS)
@pytest.mark.parametrize("mode", SCALE_MODES)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_every_bit_pattern_rowwise_and_columnwise(fmt, mode, dtype_id):
  """All bf16 / f16 bit patterns (NaN, Inf, subnormals, zero blocks), along either axis,
  to every output dtype; block sizes 16 and 64 rowwise (the scalar path's runs)."""
  x = jnp.asarray(exhaustive_rows(dtype_id))
  for axis in (1, 0):
    for dtype in DTYPES:
      got = mxjax.fake_quantize(x, fmt, axis=axis, scale_mode=mode, dtype=dtype)
      assert got.dtype == dtype and got.shape == x.shape
      assert_same_floats(got, oracle(x, fmt, axis, dtype, mode=mode))
  for block_size in (16, 64):
    got = mxjax.fake_quantize(x, fmt, block_size=block_size, scale_mode=mode)
    assert_same_floats(got, oracle(x, fmt, 1, x.dtype, block_size, mode))


@given(data=st.data(), shape_axis=shapes_and_axes(max_rank=3, max_len=300),
       fmt=st.sampled_from(FORMAT_NAMES), in_dtype=st.sampled_from(DTYPES),
       dtype=st.sampled_from(DTYPES))
def test_random_shapes_axes_and_dtypes(data, shape_axis, fmt, in_dtype, dtype):
  """Ragged lengths, any axis of rank 1-3, specials mixed in."""
  shape, axis = shape_axis
  x = jnp.asarray(data.draw(float_arrays(shape, in_dtype)))
  got = mxjax.fake_quantize(x, fmt, axis=axis, dtype=dtype)
  assert_same_floats(got, oracle(x, fmt, axis % x.ndim, dtype))


@pytest.mark.parametrize("shape_axis_dtype", [((4096, 4096), 0, jnp.bfloat16),
                                              ((2048, 8200), 1, jnp.bfloat16),
                                              ((1024, 8200), 0, jnp.float32)],
                         ids=["cols-bf16", "rows-ragged-bf16", "cols-ragged-f32"])
@pytest.mark.parametrize("fmt", ["e4m3", "e3m2", "e2m1"])
def test_outputs_past_the_streaming_store_size(shape_axis_dtype, fmt):
  """Outputs of 32 MiB and more are written with streaming stores, run by run: rows of
  whole aligned lines (8200 columns: every 4th row), the ragged ends and the blocks left
  to the scalar path with ordinary stores."""
  shape, axis, dtype = shape_axis_dtype
  x = jnp.asarray(wide_mixed_blocks(*shape, seed=shape[1]))
  assert math.prod(shape) * jnp.dtype(dtype).itemsize >= 32 << 20
  assert_same_floats(mxjax.fake_quantize(x, fmt, axis=axis, dtype=dtype),
                     oracle(x, fmt, axis, dtype))


def test_vmap_moves_the_axis_and_the_gradient_is_straight_through():
  x = jnp.asarray(wide_mixed_blocks(6 * 40, 96, seed=7)).reshape(6, 40, 96)
  per_item = jax.vmap(lambda v: mxjax.fake_quantize(v, "e2m3", axis=0, dtype=jnp.float32))(x)
  assert_same_floats(per_item, oracle(x, "e2m3", 1, jnp.float32))
  y = jnp.linspace(-3, 3, 64, dtype=jnp.bfloat16).reshape(2, 32)
  g = jax.grad(lambda v: jnp.sum(mxjax.fake_quantize(v, "e2m1", dtype=jnp.float32) *
                                 jnp.arange(64.0).reshape(2, 32)))(y)
  assert g.dtype == jnp.bfloat16  # the input's dtype, the values passed through
  np.testing.assert_array_equal(np.asarray(g, np.float32), np.arange(64.0).reshape(2, 32))


def test_bad_output_dtype_is_an_error():
  with pytest.raises(TypeError, match="fake_quantize produces bfloat16, float16 or float32"):
    mxjax.fake_quantize(jnp.ones((4, 32)), dtype=jnp.int8)


def _custom_calls(fn, *args) -> dict:
  text = jax.jit(fn).lower(*args).compile().as_text()
  return {t: text.count(f'custom_call_target="{t}"')
          for t in ("mxjax_quantize", "mxjax_dequantize", "mxjax_fake_quantize")}


@needs_cpu_kernels
def test_a_product_without_backward_runs_one_fused_call_per_operand():
  """mxjax.matmul's forward (no gradient) quantizes and dequantizes each operand in one
  kernel pass; its values are those of the oracle's operands, through XLA's dot."""
  x = jnp.asarray(wide_mixed_blocks(64, 256, seed=1)).clip(-1e30, 1e30)
  x = jnp.where(jnp.isfinite(x), x, 0)
  w = jax.random.normal(jax.random.key(0), (256, 96), jnp.bfloat16)
  assert _custom_calls(mxjax.matmul, x, w) == {
      "mxjax_quantize": 0, "mxjax_dequantize": 0, "mxjax_fake_quantize": 2}
  qx, qw = oracle(x, "e4m3", 1, jnp.bfloat16), oracle(w, "e4m3", 0, jnp.bfloat16)
  want = jax.jit(lambda a, b: jax.lax.optimization_barrier(jnp.dot(
      a, b, preferred_element_type=jnp.float32)).astype(jnp.bfloat16))(qx, qw)
  np.testing.assert_array_equal(np.asarray(jax.jit(mxjax.matmul)(x, w), np.float32),
                                np.asarray(want, np.float32))


@needs_cpu_kernels
def test_the_cuda_lowering_uses_the_fused_kernel(monkeypatch):
  """Under MXJAX_KERNELS=ffi a program exported for CUDA calls the one-pass
  mxjax_fake_quantize kernel, as on the CPU (a build with CUDA registers it for both)."""
  monkeypatch.setattr(backend, "built_platforms", lambda: ("cpu", "cuda"))
  monkeypatch.setattr(backend, "get_kernels", lambda: "ffi")
  cpu_targets = extension.targets("cpu")
  monkeypatch.setattr(extension, "targets", lambda p: cpu_targets)  # CUDA's names are the CPU's
  x = jnp.ones((64, 96), jnp.bfloat16)
  fn = jax.jit(lambda v: mxjax.fake_quantize(v, "e5m2", axis=0))
  targets = ("mxjax_quantize", "mxjax_dequantize", "mxjax_fake_quantize")
  checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in targets]
  for platform, want in (("cuda", (0, 0, 1)), ("cpu", (0, 0, 1))):
    text = jax.export.export(fn, platforms=[platform], disabled_checks=checks)(
        x).mlir_module()
    assert tuple(text.count(f"@{t}(") for t in targets) == want, platform
