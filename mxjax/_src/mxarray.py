"""MXArray: a block-scaled tensor (quantized data + E8M0 scales + static metadata)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.serialization
import jax
import jax.numpy as jnp

from mxjax._src import export_pytrees, formats


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MXArray:
  """A tensor quantized to an MX format along one axis.

  Children (traced): `data` and `scales`. Everything else is static metadata, so an
  MXArray can cross `jax.jit`, `jax.vmap`, `jax.grad` and Flax variable collections.

  Attributes:
    data: the element codes. e4m3 / e5m2: `float8_e4m3fn` / `float8_e5m2`, shape = `shape`.
      FP6 / FP4: uint8, packed along `axis` (4 codes in 3 bytes / 2 codes per byte), so
      that axis has `element_format.storage_length(n)` entries.
    scales: `float8_e8m0fnu`, shape = `shape` with `ceil(n / block_size)` along `axis`.
    format: element format name ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1").
    block_size: elements per scale along the quantized axis.
    axis_from_end: the quantized axis counted from the end (-1 is the last axis). Counting
      from the end keeps the metadata true when `jax.vmap` adds leading batch axes.
    length: the logical length of the quantized axis.
    dtype: the high-precision dtype the tensor was quantized from.
    scale_mode: "rceil" or "floor": how the scales were chosen.
  """

  data: jax.Array
  scales: jax.Array
  format: str = dataclasses.field(metadata=dict(static=True))
  block_size: int = dataclasses.field(metadata=dict(static=True))
  axis_from_end: int = dataclasses.field(metadata=dict(static=True))
  length: int = dataclasses.field(metadata=dict(static=True))
  dtype: Any = dataclasses.field(metadata=dict(static=True))
  scale_mode: str = dataclasses.field(default="rceil", metadata=dict(static=True))

  def __post_init__(self):
    # Also runs when jax rebuilds the tree (jit, vmap, tree.map): a vmap axis placed at or
    # after the quantized axis (in_axes / out_axes) cannot update the static metadata.
    shapes = [getattr(a, "shape", None) for a in (self.data, self.scales)]
    if None in shapes or not all(isinstance(d, int) for shape in shapes for d in shape):
      return  # stand-ins (None, sentinels, PartitionSpecs) or symbolic shapes
    fmt = formats.element_format(self.format)
    data, scales, n = shapes[0], shapes[1], len(shapes[1])
    fits = len(data) == n and -n <= self.axis_from_end < 0
    if fits:
      axis = n + self.axis_from_end
      fits = (scales[axis] == -(-self.length // self.block_size)
              and data[axis] == fmt.storage_length(self.length)
              and data[:axis] + data[axis + 1:] == scales[:axis] + scales[axis + 1:])
    if not fits:
      raise ValueError(
          f"MXArray: data {tuple(data)} and scales {tuple(scales)} do not fit {self.format} "
          f"quantized along axis {self.axis_from_end} (from the end) of length "
          f"{self.length} in blocks of {self.block_size}. A jax.vmap whose in_axes / "
          f"out_axes put the mapped axis at or after the quantized axis does this (the "
          f"metadata counts that axis from the end, so only leading mapped axes keep it "
          f"true): map over a leading axis, or dequantize first; a jax.tree.map over the "
          f"MXArray's arrays must keep their shapes.")

  @property
  def axis(self) -> int:
    """The quantized axis, non-negative."""
    return self.ndim + self.axis_from_end

  @property
  def shape(self) -> tuple[int, ...]:
    """The logical shape (the data's shape, with packing undone along `axis`)."""
    shape = list(self.scales.shape)
    shape[self.axis_from_end] = self.length
    return tuple(shape)

  @property
  def element_format(self) -> formats.ElementFormat:
    return formats.element_format(self.format)

  @property
  def ndim(self) -> int:
    return self.scales.ndim

  @property
  def size(self) -> int:
    return math.prod(self.shape)

  @property
  def nbytes(self) -> int:
    """Bytes of storage: data plus scales."""
    return _nbytes(self.data) + _nbytes(self.scales)

  def dequantize(self, dtype=jnp.float32) -> jax.Array:
    """Decodes to a `dtype` array of shape `shape` (bf16, f16 or f32)."""
    from mxjax._src.quantize import dequantize  # quantize.py builds on this file
    return dequantize(self, dtype)

  def __array__(self, dtype=None, copy=None):
    # Without this, np.asarray(mx) silently makes a 0-d object array and jnp.asarray(mx)
    # fails with an unrelated message.
    raise TypeError(f"{self!r} is block-scaled; it has no single array value until "
                    f"decoded: call .dequantize(dtype) for a bf16 / f16 / f32 array.")

  def __repr__(self) -> str:
    if not hasattr(self.scales, "shape"):  # stand-ins, e.g. Flax's display of variables
      return (f"MXArray(data={self.data!r}, scales={self.scales!r}, format={self.format}, "
              f"axis_from_end={self.axis_from_end}, length={self.length}, "
              f"block_size={self.block_size}, scale_mode={self.scale_mode}, "
              f"dtype={jnp.dtype(self.dtype).name})")
    return (f"MXArray(format={self.format}, shape={self.shape}, axis={self.axis}, "
            f"block_size={self.block_size}, scale_mode={self.scale_mode}, "
            f"dtype={jnp.dtype(self.dtype).name})")


def _nbytes(a) -> int:
  return math.prod(a.shape) * jnp.dtype(a.dtype).itemsize


# Flax's checkpoint route (`flax.serialization.to_bytes` / `from_bytes`, `to_state_dict` /
# `from_state_dict`): an MXArray's state is its two arrays; the static metadata comes from
# the restore target, as for any pytree node.
flax.serialization.register_serialization_state(
    MXArray,
    lambda a: {"data": a.data, "scales": a.scales},
    lambda target, state: dataclasses.replace(
        target, data=flax.serialization.from_state_dict(target.data, state["data"]),
        scales=flax.serialization.from_state_dict(target.scales, state["scales"])))
# jax.export's route (an exported function that takes or returns MXArrays).
export_pytrees.register(MXArray, "MXArray")
