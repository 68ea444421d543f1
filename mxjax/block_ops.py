"""Block-scaled formats (`mxjax.block_format`) as JAX ops: quantize, quantize_2x,
dequantize and fake_quantize, lowered per platform inside one program: the CPU kernels
(ffi/cpu/block_kernels.cc, at the SIMD level in use) where `mxjax.backend` picks the FFI
for "cpu", `mxjax.block_codec` (plain XLA, the same bits) on every other platform (there
are no CUDA block kernels).

The functions take and return what `block_codec`'s do: codes packed along the quantized
axis (2-D tiles: the last axis), uint8. The FP32 tensor scale (NVFP4) comes from the
tensor's amax, reduced first (`tensor_amax`: the mxjax_tensor_amax kernel on "cpu", an
XLA reduction elsewhere) and reaching the kernels as an operand, as do the
stochastic-rounding bits (`block_codec.random_bits`, on the global element index).

Sharding: fake_quantize (the block GEMM's operand), quantize_2x and quantize / dequantize
of 1-D blocks keep their operand's sharding on Auto and Explicit mesh axes
(`mxjax.sharding.blockwise_partitioned`; a block whose packed codes end inside a byte, as
FP4 blocks of odd length, is taken whole); quantize / dequantize of 2-D tiles run where
the partitioner places them (the whole array). `tensor_amax` reduces each shard and takes
the max over the shards (`lax.pmax`). Under `jax.vmap` the ops run the XLA path. None has
a derivative (see `mxjax.fake_quantize` for a straight-through one).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from mxjax import block_codec, formats, sharding
from mxjax.block_format import BlockFormat
from mxjax.quantize import _no_derivative, _per_platform

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


def _codes_type(shape, bf: BlockFormat, axis: int):
  """Packed codes of an array of `shape` (`block_codec.pack`)."""
  a = block_codec.packed_axis(bf, axis, len(shape))
  shape = tuple(bf.element_format.storage_length(n) if i == a else n
                for i, n in enumerate(shape))
  return jax.ShapeDtypeStruct(shape, jnp.uint8)


def _storage_per_block(bf: BlockFormat) -> int | None:
  """Bytes of packed codes per 1-D block, or None where a block ends inside a byte."""
  fmt, b = bf.element_format, bf.block[1]
  return None if b % fmt.codes_per_group else b // fmt.codes_per_group * fmt.bytes_per_group


def _strided_split(shape, bf: BlockFormat, axis: int) -> bool:
  """Whether quantizing along `axis` of `shape` packs codes along a strided axis in
  blocks that end inside a packing group (the kernels write whole bytes per block: such
  a quantize runs the XLA path)."""
  fmt = bf.element_format
  return (not bf.two_d and math.prod(shape[axis + 1:]) > 1 and
          bf.block[1] % fmt.codes_per_group != 0 and shape[axis] > bf.block[1])


def _ts_operand(ts):
  return jnp.zeros((1,), jnp.uint32) if ts is None else jnp.reshape(ts, (1,)).astype(jnp.uint32)


def _lowered(ffi, xla):
  """`ffi` on "cpu" where the FFI kernels are in use, `xla` elsewhere (no CUDA targets)."""
  return lambda *args: _per_platform(xla, xla, *args, cpu_fn=ffi)


def _whole(call):
  """`call` on operands gathered from Explicit mesh axes (the whole array, as Auto axes
  give it where a call has no sharding rule)."""
  def whole(*args):
    if any(sharding.typed_spec(a) is not None for a in args):
      args = [jax.sharding.reshard(a, jax.sharding.PartitionSpec()) for a in args]
    return call(*args)
  return whole


def _partitioned(call, bf: BlockFormat, axes, kind: str):
  """`call` with its sharding rules (blocked `axes`) where they exist for `kind` and `bf`;
  else `_whole(call)`."""
  storage = bf.block[1] if kind == "fake_quantize" else _storage_per_block(bf)
  if (bf.two_d and kind != "fake_quantize") or storage is None:
    return _whole(call)
  axes = (-2, -1) if bf.two_d else axes
  return sharding.blockwise_partitioned(call, axes, bf.block[1], storage, kind=kind)


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
    if _strided_split(x.shape, bf, axis):
      return xla(x, rand, ts)
    out = (_codes_type(x.shape, bf, axis), _scales_type(x.shape, bf, axis))
    return jax.ffi.ffi_call("mxjax_block_quantize", out)(x, rand, ts, **_attrs(bf, axis),
                                                         stochastic_rounding=sr)

  call = _partitioned(_lowered(ffi, xla), bf, (axis,), "quantize")
  return _op(call, xla, "mxjax.block_ops.quantize")


@functools.lru_cache(maxsize=None)
def _quantize_2x_op(bf: BlockFormat):
  """(x, ts) -> (row codes, row scales, column codes, column scales)."""

  def xla(x, ts):
    t = ts[0] if bf.tensor_scale else None
    return (*block_codec.quantize(x, bf, x.ndim - 1, None, t)[:2],
            *block_codec.quantize(x, bf, x.ndim - 2, None, t)[:2])

  def ffi(x, ts):
    if _strided_split(x.shape, bf, x.ndim - 2):
      return xla(x, ts)
    out = (_codes_type(x.shape, bf, x.ndim - 1), _scales_type(x.shape, bf, x.ndim - 1),
           _codes_type(x.shape, bf, x.ndim - 2), _scales_type(x.shape, bf, x.ndim - 2))
    return jax.ffi.ffi_call("mxjax_block_quantize_2x", out)(x, ts, **_attrs(bf, x.ndim - 1))

  call = _partitioned(_lowered(ffi, xla), bf, (-1, -2), "quantize")
  return _op(call, xla, "mxjax.block_ops.quantize_2x")


@functools.lru_cache(maxsize=None)
def _fake_quantize_op(bf: BlockFormat, axis: int, sr: bool):
  """(x, rand, ts) -> f32 values, no tensor scale applied."""

  def xla(x, rand, ts):
    codes, scales, _ = block_codec.quantize(x, bf, axis, rand if sr else None,
                                            ts[0] if bf.tensor_scale else None)
    return block_codec.dequantize(codes, scales, None, bf, axis, apply_tensor_scale=False,
                                  length=x.shape[block_codec.packed_axis(bf, axis, x.ndim)])

  def ffi(x, rand, ts):
    return jax.ffi.ffi_call("mxjax_block_fake_quantize",
                            jax.ShapeDtypeStruct(x.shape, jnp.float32))(
                                x, rand, ts, **_attrs(bf, axis), stochastic_rounding=sr)

  call = _partitioned(_lowered(ffi, xla), bf, (axis,), "fake_quantize")
  return _op(call, xla, "mxjax.block_ops.fake_quantize")


@functools.lru_cache(maxsize=None)
def _dequantize_op(bf: BlockFormat, axis: int, apply_tensor_scale: bool, length: int):
  """(codes, scales, ts) -> f32 values, `length` along the packed axis."""

  def local_length(scales):
    """`length` on a shard (the call runs per shard): shards hold whole blocks, or all."""
    a = block_codec.packed_axis(bf, axis, scales.ndim)
    return length - (-(-length // bf.block[1]) - scales.shape[a]) * bf.block[1]

  def xla(codes, scales, ts):
    return block_codec.dequantize(codes, scales, ts[0], bf, axis, apply_tensor_scale,
                                  local_length(scales))

  def ffi(codes, scales, ts):
    a = block_codec.packed_axis(bf, axis, codes.ndim)
    shape = codes.shape[:a] + (local_length(scales),) + codes.shape[a + 1:]
    return jax.ffi.ffi_call("mxjax_block_dequantize",
                            jax.ShapeDtypeStruct(shape, jnp.float32))(
                                codes, scales, ts, **_attrs(bf, axis),
                                apply_tensor_scale=apply_tensor_scale)

  call = _partitioned(_lowered(ffi, xla), bf, (axis,), "dequantize")
  return _op(call, xla, "mxjax.block_ops.dequantize")


def _amax_local(x):
  """The amax of x (or of the shard it is): the kernel on "cpu", XLA elsewhere."""

  def ffi(x):
    out = jax.ffi.ffi_call("mxjax_tensor_amax", jax.ShapeDtypeStruct((1,), jnp.uint32))(x)
    return jnp.reshape(out, ())

  return _lowered(ffi, block_codec.tensor_amax)(x)


def _amax_partition(mesh, arg_shapes, result_shape):
  """Each shard's amax, then the max over the mesh axes x is sharded over."""
  del result_shape
  ndim = len(arg_shapes[0].shape)
  spec = sharding.spec_over_mesh(arg_shapes[0].sharding, mesh, ndim)
  spec = spec if spec is not None else (None,) * ndim  # not a PartitionSpec: gathered
  axes = tuple(name for entry in spec for name in sharding.axis_names(entry))

  def local(x):
    a = _amax_local(x)
    return jax.lax.pmax(a, axes) if axes else a

  return (mesh, local, NamedSharding(mesh, PartitionSpec()),
          (NamedSharding(mesh, PartitionSpec(*spec)),))


def _amax_rule(mesh, operand_types, result_types):
  del mesh, result_types
  return " ".join(f"d{i}" for i in range(len(operand_types[0].shape))) + " ->"


@functools.lru_cache(maxsize=None)
def _amax_op():
  """x -> its amax (uint32 scalar) on any Auto or Explicit mesh axes."""
  op = custom_partitioning(_amax_local)
  op.def_partition(partition=_amax_partition, decode_shardings=False,
                   sharding_rule=_amax_rule)

  def run(x):
    spec = sharding.typed_spec(x)
    if spec is None:  # no Explicit axis in x's type: the rule above applies
      return op(x)
    mesh = jax.typeof(x).sharding.mesh
    axes = tuple(name for entry in spec for name in sharding.axis_names(entry))
    auto_left = any(t == jax.sharding.AxisType.Auto and mesh.shape[name] > 1
                    for name, t in zip(mesh.axis_names, mesh.axis_types) if name not in axes)
    body = lambda x: jax.lax.pmax((op if auto_left else _amax_local)(x), axes)  # noqa: E731
    return jax.shard_map(body, mesh=mesh, in_specs=PartitionSpec(*spec),
                         out_specs=PartitionSpec(), axis_names=set(axes))(x)

  return _op(run, block_codec.tensor_amax, "mxjax.block_ops.tensor_amax")


def tensor_amax(x) -> jax.Array:
  """The largest f32 bits of |x| over x's finite elements (uint32 scalar; NaN / Inf count
  as 0; 0 for an empty or all-zero x): `mxjax.reference.tensor_scale`'s amax, the same on
  any mesh as on one device."""
  if x.size == 0:
    return jnp.zeros((), jnp.uint32)
  return _amax_op()(x)


def tensor_scale(x, bf: BlockFormat) -> jax.Array:
  """As `block_codec.tensor_scale`, its amax from `tensor_amax`."""
  return block_codec.tensor_scale(x, bf, amax=tensor_amax(x))


def _check(x, bf: BlockFormat, axis: int) -> int:
  if bf.two_d and x.ndim < 2:
    raise ValueError(f"{bf}: 2-D blocks need an array of rank >= 2, got shape {x.shape}")
  if not -x.ndim <= axis < x.ndim:
    raise ValueError(f"axis {axis} is out of range for shape {x.shape}")
  return axis % x.ndim


def quantize(x, bf: BlockFormat, axis: int = -1, rand=None, tensor_scale_bits=None):
  """x (bf16 / f16 / f32) -> (codes: uint8, x's shape packed along the quantized axis
  (2-D tiles: the last), scales, tensor scale f32 bits or None), as
  `mxjax.reference.block_quantize` (bit for bit, its codes packed: `block_codec.pack`).
  `rand`: uint32 bits of x's shape for stochastic rounding; `tensor_scale_bits`: a given
  tensor scale (else x's)."""
  axis = _check(x, bf, axis)
  ts = None
  if bf.tensor_scale:
    ts = tensor_scale(x, bf) if tensor_scale_bits is None else tensor_scale_bits
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
  ts = tensor_scale(x, bf) if bf.tensor_scale else None
  rc, rs, cc, cs = _quantize_2x_op(bf)(x, _ts_operand(ts))
  return (rc, rs), (cc, cs), ts


def dequantize(codes, scales, tensor_scale_bits, bf: BlockFormat, axis: int = -1,
               apply_tensor_scale: bool = True, length: int | None = None) -> jax.Array:
  """As `mxjax.reference.block_dequantize` of the unpacked codes: f32 of x's shape, whose
  length along the packed axis is `length` (default: `block_codec.logical_length`, the
  longest the codes and scales hold; FP4 / FP6 codes of a length that is no multiple of
  their group need it given)."""
  axis = _check(codes, bf, axis)
  apply = bool(bf.tensor_scale and apply_tensor_scale)
  if apply and tensor_scale_bits is None:
    raise ValueError(f"{bf}: dequantize needs the tensor scale (quantize's third result)")
  if length is None:
    length = block_codec.logical_length(codes.shape, scales.shape, bf, axis)
  ts = _ts_operand(tensor_scale_bits if apply else None)
  return _dequantize_op(bf, axis, apply, int(length))(codes, scales, ts)


def fake_quantize(x, bf: BlockFormat, axis: int = -1, rand=None):
  """(dequantize(quantize(x)) without the tensor scale, f32; the tensor's decode factor
  `1 / S` as f32, or None), as `block_codec.fake_quantize`: what a GEMM multiplies."""
  axis = _check(x, bf, axis)
  ts = tensor_scale(x, bf) if bf.tensor_scale else None
  bits = _NO_BITS if rand is None else jnp.asarray(rand, jnp.uint32)
  y = _fake_quantize_op(bf, axis, rand is not None)(x, bits, _ts_operand(ts))
  inv = None if ts is None else 1.0 / jax.lax.bitcast_convert_type(ts, jnp.float32)
  return y, inv
