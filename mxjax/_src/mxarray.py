"""MXArray: a block-scaled tensor of any format (codes, scales, an optional tensor scale,
and the static format, axis and logical shape)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.serialization
import jax
import jax.numpy as jnp

from mxjax._src import export_pytrees, formats
from mxjax._src.formats import BlockFormat


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, init=False)
class MXArray:
  """A tensor quantized to a block-scaled format (`BlockFormat`: MX, NVFP4, FP8 blocks).

  Children (traced): `data`, `scales` and `tensor_scale`; the rest is static metadata.

  Attributes:
    data: the element codes along the packed axis (`axis`; the last for tiles): FP8 as
      float8 of the logical shape; FP6 / FP4 packed in uint8
      (`element_format.storage_length(n)` entries).
    scales: the decode scales, one per block, in `format.scale.dtype`: `ceil(n / b)` along
      the packed axis (1-D), or `[..., ceil(R / b), ceil(C / b)]` (tiles).
    tensor_scale: f32 scalar S (NVFP4): values are `code * scale / S`; else None.
    format: the `BlockFormat`.
    axis_from_end: the packed axis counted from the end (-1 for tiles; true under vmap).
    length: the logical length of the packed axis.
    dtype: the high-precision dtype the tensor was quantized from.
  """

  data: jax.Array
  scales: jax.Array
  tensor_scale: jax.Array | None
  format: BlockFormat = dataclasses.field(metadata=dict(static=True))
  axis_from_end: int = dataclasses.field(metadata=dict(static=True))
  length: int = dataclasses.field(metadata=dict(static=True))
  dtype: Any = dataclasses.field(metadata=dict(static=True))

  def __init__(self, data, scales, format, axis_from_end: int, length: int, dtype,
               tensor_scale=None, *, block_size: int | None = None, scale_mode=None):
    """`format` is a BlockFormat, or an MX element name with `block_size`, `scale_mode`."""
    fmt = formats.as_block_format(format, block_size, scale_mode)
    for name, value in (("data", data), ("scales", scales), ("tensor_scale", tensor_scale),
                        ("format", fmt), ("axis_from_end", axis_from_end), ("length", length),
                        ("dtype", dtype)):
      object.__setattr__(self, name, value)
    self._check()

  def _check(self):
    # Also runs when jax rebuilds the tree (jit, vmap, tree.map).
    shapes = [getattr(a, "shape", None) for a in (self.data, self.scales)]
    if None in shapes or not all(isinstance(d, int) for shape in shapes for d in shape):
      return  # stand-ins (None, sentinels, PartitionSpecs) or symbolic shapes
    fmt, (data, scales) = self.format, shapes
    n = len(scales)
    fits = len(data) == n and -n <= self.axis_from_end < 0 and (
        not fmt.two_d or self.axis_from_end == -1)
    if fits:
      axis = n + self.axis_from_end
      logical = list(data)
      logical[axis] = self.length
      fits = (data[axis] == fmt.element_format.storage_length(self.length)
              and tuple(scales) == self.scales_shape(tuple(logical)))
    if not fits:
      raise ValueError(
          f"MXArray: data {tuple(data)} and scales {tuple(scales)} do not fit {fmt} "
          f"quantized along axis {self.axis_from_end} (from the end) of length "
          f"{self.length} in blocks of {fmt.block_size}. A "
          f"jax.vmap whose in_axes / out_axes put the mapped axis at or after the quantized "
          f"axis does this (the metadata counts that axis from the end, so only leading "
          f"mapped axes keep it true): map over a leading axis, or dequantize first; a "
          f"jax.tree.map over the MXArray's arrays must keep their shapes.")

  def scales_shape(self, shape) -> tuple[int, ...]:
    """The scales' shape for a logical `shape`."""
    b = self.format.block_size
    if self.format.two_d:
      return (*shape[:-2], -(-shape[-2] // b), -(-shape[-1] // b))
    axis = len(shape) + self.axis_from_end
    return tuple(-(-d // b) if i == axis else d for i, d in enumerate(shape))

  @property
  def axis(self) -> int:
    """The packed axis, non-negative (the quantized axis of 1-D blocks)."""
    return self.ndim + self.axis_from_end

  @property
  def shape(self) -> tuple[int, ...]:
    """The logical shape (the data's shape, with packing undone along `axis`)."""
    shape = list(self.data.shape)
    shape[self.axis_from_end] = self.length
    return tuple(shape)

  @property
  def element_format(self) -> formats.ElementFormat:
    return self.format.element_format

  @property
  def block_size(self) -> int:
    return self.format.block_size

  @property
  def scale_mode(self) -> str:
    return self.format.scale_mode

  @property
  def ndim(self) -> int:
    return self.data.ndim

  @property
  def size(self) -> int:
    return math.prod(self.shape)

  @property
  def nbytes(self) -> int:
    """Bytes of storage: data, scales and the tensor scale."""
    return sum(_nbytes(a) for a in (self.data, self.scales, self.tensor_scale) if a is not None)

  def dequantize(self, dtype=jnp.float32) -> jax.Array:
    """Decodes to a `dtype` array of shape `shape` (bf16, f16 or f32)."""
    from mxjax._src.quantize import dequantize  # quantize builds on this file
    return dequantize(self, dtype)

  def __array__(self, dtype=None, copy=None):
    raise TypeError(f"{self!r} is block-scaled; it has no single array value until "
                    f"decoded: call .dequantize(dtype) for a bf16 / f16 / f32 array.")

  def __repr__(self) -> str:
    if not hasattr(self.data, "shape"):  # stand-ins, e.g. Flax's display of variables
      return (f"MXArray(data={self.data!r}, scales={self.scales!r}, format={self.format}, "
              f"axis_from_end={self.axis_from_end}, length={self.length}, "
              f"dtype={jnp.dtype(self.dtype).name})")
    return (f"MXArray(format={self.format}, shape={self.shape}, axis={self.axis}, "
            f"dtype={jnp.dtype(self.dtype).name})")


def _nbytes(a) -> int:
  return math.prod(a.shape) * jnp.dtype(a.dtype).itemsize


def _state_dict(a: MXArray) -> dict:
  state = {"data": a.data, "scales": a.scales}
  if a.tensor_scale is not None:
    state["tensor_scale"] = a.tensor_scale
  return state


def _restore(target: MXArray, state: dict) -> MXArray:
  if (target.tensor_scale is None) != ("tensor_scale" not in state):
    raise ValueError(
        f"restoring an MXArray of {target.format}: the checkpoint "
        f"{'has no' if target.tensor_scale is not None else 'has a'} tensor scale, so it "
        f"holds another format; restore into a target of the format it was saved in")
  restored = {k: flax.serialization.from_state_dict(getattr(target, k), v)
              for k, v in state.items()}
  return dataclasses.replace(target, **restored)


# Flax checkpoints: the arrays; the static metadata comes from the restore target.
flax.serialization.register_serialization_state(MXArray, _state_dict, _restore)
# jax.export's route (an exported function that takes or returns MXArrays).
export_pytrees.register(MXArray, "MXArray")
