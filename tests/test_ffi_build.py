"""The compiled extension: it loads, registers its FFI targets, reports its build, and its
kernels answer bad attributes and buffers with an error instead of crashing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mxjax._src import extension

TARGETS = {"mxjax_quantize", "mxjax_quantize_2x", "mxjax_dequantize"}  # CPU and CUDA
BLOCK_TARGETS = {"mxjax_block_quantize", "mxjax_block_quantize_2x", "mxjax_block_dequantize",
                 "mxjax_block_fake_quantize", "mxjax_tensor_amax"}  # CPU and CUDA
CPU_ONLY_TARGETS = {"mxjax_fake_quantize"}  # CUDA has it too
CPU_TARGETS = {"mxjax_rht_quantize", "mxjax_rht_amax"}  # CPU only (GPUs: XLA)
CUDA_TARGETS = {"mxjax_swizzle_scales", "mxjax_mx_gemm", "mxjax_fp8_block_gemm"}  # CUDA only


def test_extension_loads_and_registers():
  from mxjax import _mxjax_ffi
  regs = _mxjax_ffi.registrations()
  assert set(regs) == TARGETS | BLOCK_TARGETS | CPU_ONLY_TARGETS | CPU_TARGETS
  assert all(type(c).__name__ == "PyCapsule" for c in regs.values())
  cuda = set(_mxjax_ffi.cuda_registrations())
  assert not cuda or TARGETS | BLOCK_TARGETS | CPU_ONLY_TARGETS | CUDA_TARGETS <= cuda  # empty without CUDA
  extension.load()
  extension.load()  # registering twice is a no-op


def test_build_info():
  info = extension.build_info()
  assert info["cpu"] is True
  assert isinstance(info["cuda"], bool)
  assert info["simd"] in info["simd_compiled"]
  assert set(info["simd_compiled"]) <= {"scalar", "avx2", "avx512"}
  assert isinstance(info["sanitize"], bool)


def _quantize_call(x, *, format=0, scale_mode=0, block_size=32, axis=1, data_dtype=None,
                   nb=None):
  n = x.shape[-1]
  nb = -(-n // block_size) if nb is None else nb
  out = (jax.ShapeDtypeStruct(x.shape, data_dtype or jnp.float8_e4m3fn),
         jax.ShapeDtypeStruct((x.shape[0], nb), jnp.float8_e8m0fnu))
  extension.load()
  return jax.jit(lambda x: jax.ffi.ffi_call("mxjax_quantize", out)(
      x, format=np.int32(format), scale_mode=np.int32(scale_mode),
      block_size=np.int64(block_size), axis=np.int64(axis)))(x)


def test_kernel_runs():
  from mxjax import reference
  x = jnp.arange(-64, 64, dtype=jnp.float32).reshape(2, 64).astype(jnp.bfloat16)
  data, scales = _quantize_call(x)
  want_data, want_scales = reference.quantize(x, "e4m3")
  assert data.dtype == jnp.float8_e4m3fn and scales.shape == (2, 2)
  np.testing.assert_array_equal(np.asarray(data).view(np.uint8), np.asarray(want_data).view(np.uint8))
  np.testing.assert_array_equal(np.asarray(scales).view(np.uint8),
                                np.asarray(want_scales).view(np.uint8))


@pytest.mark.parametrize("kwargs, message", [
    (dict(block_size=24, nb=3), "block_size"),
    (dict(block_size=0, nb=1), "block_size"),
    (dict(format=9), "format"),
    (dict(scale_mode=5), "scale_mode"),
    (dict(axis=3), "axis"),
    (dict(data_dtype=jnp.uint8), "dtype"),
    (dict(nb=7), "shape"),
])
def test_bad_attributes_raise(kwargs, message):
  x = jnp.ones((2, 64), jnp.bfloat16)
  with pytest.raises(Exception, match=message):
    jax.block_until_ready(_quantize_call(x, **kwargs))


def test_bad_input_dtype_raises():
  x = jnp.ones((2, 64), jnp.int32)
  with pytest.raises(Exception, match="bf16, f16 or f32"):
    jax.block_until_ready(_quantize_call(x))


def test_dequantize_bad_block_size_raises():
  extension.load()
  data = jnp.zeros((2, 64), jnp.float8_e4m3fn)
  scales = jnp.zeros((2, 2), jnp.float8_e8m0fnu)
  call = jax.ffi.ffi_call("mxjax_dequantize", jax.ShapeDtypeStruct((2, 64), jnp.float32))
  with pytest.raises(Exception, match="block_size"):
    jax.block_until_ready(jax.jit(lambda d, s: call(
        d, s, format=np.int32(0), block_size=np.int64(48), axis=np.int64(1)))(data, scales))


def test_quantize_2x_needs_rank_2():
  extension.load()
  x = jnp.ones((64,), jnp.float32)
  out = [jax.ShapeDtypeStruct((64,), jnp.float8_e4m3fn),
         jax.ShapeDtypeStruct((2,), jnp.float8_e8m0fnu)] * 2
  call = jax.ffi.ffi_call("mxjax_quantize_2x", out)
  with pytest.raises(Exception, match="rank"):
    jax.block_until_ready(jax.jit(lambda x: call(
        x, format=np.int32(0), scale_mode=np.int32(0), block_size=np.int64(32)))(x))


@pytest.mark.parametrize("x_dtype, out_shape, out_dtype, axis, message", [
    (jnp.int32, (2, 64), jnp.float32, 1, "needs a bf16, f16 or f32 input"),
    (jnp.bfloat16, (2, 64), jnp.int32, 1, "produces bf16, f16 or f32"),
    (jnp.bfloat16, (2, 64), jnp.float32, 2, "axis 2 out of range"),
    (jnp.bfloat16, (2, 32), jnp.float32, 1, "out has the wrong shape"),
])
def test_fake_quantize_bad_buffers_raise(x_dtype, out_shape, out_dtype, axis, message):
  extension.load()
  x = jnp.ones((2, 64), x_dtype)
  call = jax.ffi.ffi_call("mxjax_fake_quantize", jax.ShapeDtypeStruct(out_shape, out_dtype))
  with pytest.raises(Exception, match=message):
    jax.block_until_ready(jax.jit(lambda x: call(
        x, format=np.int32(0), scale_mode=np.int32(0), block_size=np.int64(32),
        axis=np.int64(axis)))(x))


def test_backend_info_reports_the_cpu_path():
  import mxjax
  info = mxjax.backend_info()
  assert info["platform"] == "cpu"
  assert info["build"] == extension.build_info()
  assert info["build"]["simd"] in info["ops"]["quantize"]
  assert "C++ FFI kernels" in info["ops"]["quantize_2x"]
  assert "fake_quantize with no backward" in info["ops"]["dot_general"]
  assert "XLA's dot" in info["ops"]["dot_general"]
