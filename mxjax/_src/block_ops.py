"""Block-scaled formats (`mxjax.block_format`) as JAX ops: quantize, quantize_2x,
dequantize and fake_quantize, lowered per platform inside one program: the CPU kernels
(ffi/cpu/block_kernels.cc, at the SIMD level in use) where `mxjax.backend` picks the FFI
for "cpu", `mxjax.block_codec` (plain XLA, the same bits) on every other platform (there
are no CUDA block kernels).

The functions take and return what `block_codec`'s do. The FP32 tensor scale (NVFP4) is
reduced over the whole tensor in XLA first and reaches the kernels as an operand, as do
the stochastic-rounding bits (`block_codec.random_bits`, on the global element index).

Sharding: fake_quantize (the block GEMM's operand), quantize_2x and quantize / dequantize
of 1-D blocks keep their operand's sharding on Auto and Explicit mesh axes
(`mxjax._src.sharding.blockwise_partitioned`); quantize / dequantize of 2-D tiles run where
the partitioner places them (the whole array). Under `jax.vmap` the ops run the XLA path.
None has a derivative (see `mxjax.fake_quantize` for a straight-through one).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap

from mxjax._src import block_codec, formats, sharding
from mxjax._src.block_format import BlockFormat
from mxjax._src.quantize import _no_derivative, _per_platform

_NO_BITS = np.zeros((1,), np.uint32)  # the rand operand without stochastic rounding


def _attrs(bf: BlockFormat, axis: int) -> dict:
  return dict(format=np.int32(bf.element_format.ffi_id), scale=np.int32(bf.scale.ffi_id),
              scale_mode=np.int32(formats.scale_mode(bf.scale_mode).ffi_id),
              block_rows=np.int64(bf.block[0]), block_cols=np.int64(bf.block[1]),
              axis=np.int64(axis))


def _scales_type(shape, bf: BlockFormat, axis: int):
  if bf.two_d:
    b = bf.block[0]
    shape = (*shape[:-2], -(-shape[-2] // b), -(-shape[-1] // b))
  else:
    shape = tuple(-(-n // bf.block[1]) if i == axis else n for i, n in enumerate(shape))
  return jax.ShapeDtypeStruct(shape, jnp.uint32 if bf.scale.bytes == 4 else jnp.uint8)


def _ts_operand(ts):
  return jnp.zeros((1,), jnp.uint32) if ts is None else jnp.reshape(ts, (1,)).astype(jnp.uint32)


def _lowered(ffi, xla):
  """`ffi` on "cpu" where the FFI kernels are in use, `xla` elsewhere (no CUDA targets)."""
  return lambda *args: _per_platform(xla, xla, *args, cpu_fn=ffi)


def _partitioned(call, bf: BlockFormat, axis: int, kind: str):
  """`call` with its sharding rules where they exist for `kind` and `bf`; else `call` on
  operands gathered from Explicit mesh axes (the whole array, as Auto axes give it)."""
  if bf.two_d and kind != "fake_quantize":
    def whole(*args):
      if any(sharding.typed_spec(a) is not None for a in args):
        args = [jax.sharding.reshard(a, jax.sharding.PartitionSpec()) for a in args]
      return call(*args)
    return whole
  axes = (-2, -1) if bf.two_d else (axis,)
  b = bf.block[1]
  return sharding.blockwise_partitioned(call, axes, b, b, kind=kind)


def _op(run, xla, name: str):
  """`run` with vmap falling back to the XLA path, jitted, without a derivative."""

  @custom_vmap
  def op(*args):
    return run(*args)

  @op.def_vmap
  def _batched(axis_size, in_batched, *args):
    del axis_size
    out = jax.vmap(xla, in_axes=tuple(0 if b else None for b in in_batched))(*args)
    return out, jax.tree.map(lambda _: True, out)

  return jax.jit(_no_derivative(op, name))


@functools.lru_cache(maxsize=None)
def _quantize_op(bf: BlockFormat, axis: int, sr: bool):
  """(x, rand, ts) -> (codes, scales)."""

  def xla(x, rand, ts):
    codes, scales, _ = block_codec.quantize(x, bf, axis, rand if sr else None,
                                            ts[0] if bf.tensor_scale else None)
    return codes, scales

  def ffi(x, rand, ts):
    out = (jax.ShapeDtypeStruct(x.shape, jnp.uint8), _scales_type(x.shape, bf, axis))
    return jax.ffi.ffi_call("mxjax_block_quantize", out)(x, rand, ts, **_attrs(bf, axis),
                                                         stochastic_rounding=sr)

  call = _partitioned(_lowered(ffi, xla), bf, axis, "quantize")
  return _op(call, xla, "mxjax._src.block_ops.quantize")


@functools.lru_cache(maxsize=None)
def _quantize_2x_op(bf: BlockFormat):
  """(x, ts) -> (row codes, row scales, column codes, column scales)."""

  def xla(x, ts):
    t = ts[0] if bf.tensor_scale else None
    return (*block_codec.quantize(x, bf, x.ndim - 1, None, t)[:2],
            *block_codec.quantize(x, bf, x.ndim - 2, None, t)[:2])

  def ffi(x, ts):
    out = (jax.ShapeDtypeStruct(x.shape, jnp.uint8), _scales_type(x.shape, bf, x.ndim - 1),
           jax.ShapeDtypeStruct(x.shape, jnp.uint8), _scales_type(x.shape, bf, x.ndim - 2))
    return jax.ffi.ffi_call("mxjax_block_quantize_2x", out)(x, ts, **_attrs(bf, x.ndim - 1))

  b = bf.block[1]
  call = sharding.blockwise_partitioned(_lowered(ffi, xla), (-1, -2), b, b)
  return _op(call, xla, "mxjax._src.block_ops.quantize_2x")


@functools.lru_cache(maxsize=None)
def _fake_quantize_op(bf: BlockFormat, axis: int, sr: bool):
  """(x, rand, ts) -> f32 values, no tensor scale applied."""

  def xla(x, rand, ts):
    codes, scales, _ = block_codec.quantize(x, bf, axis, rand if sr else None,
                                            ts[0] if bf.tensor_scale else None)
    return block_codec.dequantize(codes, scales, None, bf, axis, apply_tensor_scale=False)

  def ffi(x, rand, ts):
    return jax.ffi.ffi_call("mxjax_block_fake_quantize",
                            jax.ShapeDtypeStruct(x.shape, jnp.float32))(
                                x, rand, ts, **_attrs(bf, axis), stochastic_rounding=sr)

  call = _partitioned(_lowered(ffi, xla), bf, axis, "fake_quantize")
  return _op(call, xla, "mxjax._src.block_ops.fake_quantize")


@functools.lru_cache(maxsize=None)
def _dequantize_op(bf: BlockFormat, axis: int, apply_tensor_scale: bool):
  """(codes, scales, ts) -> f32 values."""

  def xla(codes, scales, ts):
    return block_codec.dequantize(codes, scales, ts[0], bf, axis, apply_tensor_scale)

  def ffi(codes, scales, ts):
    return jax.ffi.ffi_call("mxjax_block_dequantize",
                            jax.ShapeDtypeStruct(codes.shape, jnp.float32))(
                                codes, scales, ts, **_attrs(bf, axis),
                                apply_tensor_scale=apply_tensor_scale)

  call = _partitioned(_lowered(ffi, xla), bf, axis, "dequantize")
  return _op(call, xla, "mxjax._src.block_ops.dequantize")


def _check(x, bf: BlockFormat, axis: int) -> int:
  if bf.two_d and x.ndim < 2:
    raise ValueError(f"{bf}: 2-D blocks need an array of rank >= 2, got shape {x.shape}")
  if not -x.ndim <= axis < x.ndim:
    raise ValueError(f"axis {axis} is out of range for shape {x.shape}")
  return axis % x.ndim


def quantize(x, bf: BlockFormat, axis: int = -1, rand=None, tensor_scale_bits=None):
  """x (bf16 / f16 / f32) -> (codes uint8 of x's shape, scales, tensor scale f32 bits or
  None), as `mxjax.reference.block_quantize` (bit for bit). `rand`: uint32 bits of x's
  shape for stochastic rounding; `tensor_scale_bits`: a given tensor scale (else x's)."""
  axis = _check(x, bf, axis)
  ts = None
  if bf.tensor_scale:
    ts = block_codec.tensor_scale(x, bf) if tensor_scale_bits is None else tensor_scale_bits
  bits = _NO_BITS if rand is None else jnp.asarray(rand, jnp.uint32)
  codes, scales = _quantize_op(bf, axis, rand is not None)(x, bits, _ts_operand(ts))
  return codes, scales, ts


def quantize_2x(x, bf: BlockFormat):
  """x [..., M, K] (rank >= 2) -> ((codes, scales) along K, (codes, scales) along M, tensor
  scale f32 bits or None): both quantizations of x in one pass over it (its 1-D blocks of
  b, b dividing 512; no stochastic rounding), each as `quantize`'s. 2-D tiles need no
  second quantization: `quantize` serves both orientations."""
  if bf.two_d:
    raise ValueError(f"{bf}: 2-D tiles serve both orientations; use block_ops.quantize")
  if x.ndim < 2:
    raise ValueError(f"quantize_2x needs an array of rank >= 2, got shape {x.shape}")
  if 512 % bf.block[1]:
    raise ValueError(f"{bf}: quantize_2x takes blocks of a size dividing 512")
  ts = block_codec.tensor_scale(x, bf) if bf.tensor_scale else None
  rc, rs, cc, cs = _quantize_2x_op(bf)(x, _ts_operand(ts))
  return (rc, rs), (cc, cs), ts


def dequantize(codes, scales, tensor_scale_bits, bf: BlockFormat, axis: int = -1,
               apply_tensor_scale: bool = True) -> jax.Array:
  """As `mxjax.reference.block_dequantize`: f32 of codes' shape."""
  axis = _check(codes, bf, axis)
  apply = bool(bf.tensor_scale and apply_tensor_scale)
  if apply and tensor_scale_bits is None:
    raise ValueError(f"{bf}: dequantize needs the tensor scale (quantize's third result)")
  ts = _ts_operand(tensor_scale_bits if apply else None)
  return _dequantize_op(bf, axis, apply)(codes, scales, ts)


def fake_quantize(x, bf: BlockFormat, axis: int = -1, rand=None):
  """(dequantize(quantize(x)) without the tensor scale, f32; the tensor's decode factor
  `1 / S` as f32, or None), as `block_codec.fake_quantize`: what a GEMM multiplies."""
  axis = _check(x, bf, axis)
  ts = block_codec.tensor_scale(x, bf) if bf.tensor_scale else None
  bits = _NO_BITS if rand is None else jnp.asarray(rand, jnp.uint32)
  y = _fake_quantize_op(bf, axis, rand is not None)(x, bits, _ts_operand(ts))
  inv = None if ts is None else 1.0 / jax.lax.bitcast_convert_type(ts, jnp.float32)
  return y, inv
