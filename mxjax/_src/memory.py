"""How much memory a model's variables take, quantized kernels included."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from mxjax._src.mxarray import MXArray


@dataclasses.dataclass(frozen=True)
class MemoryReport:
  """Bytes of a variables tree.

  Attributes:
    nbytes: bytes as stored (an MXArray counts its data and scales).
    f32_nbytes: bytes of the same logical tensors in float32 (a quantized pair of copies
      of one kernel counts once).
    quantized_nbytes, quantized_f32_nbytes: the same, over quantized kernels only.
    entries: 'path' -> (nbytes, f32_nbytes) per array or quantized kernel.
    copies: 'path' -> the copies a quantized kernel keeps, e.g. "... along axes 0, 1 (2
      copies)" (axis 0 of a [K, N] kernel: the forward's copy; 1: the dgrad's).
  """

  nbytes: int
  f32_nbytes: int
  quantized_nbytes: int
  quantized_f32_nbytes: int
  entries: dict
  copies: dict = dataclasses.field(default_factory=dict)

  @property
  def ratio(self) -> float:
    """nbytes / f32_nbytes over everything."""
    return self.nbytes / max(self.f32_nbytes, 1)

  @property
  def quantized_ratio(self) -> float:
    """nbytes / f32_nbytes over the quantized kernels (E4M3 pair, 32-blocks: 0.5156)."""
    return self.quantized_nbytes / max(self.quantized_f32_nbytes, 1)

  def __str__(self) -> str:
    return (f"{self.nbytes / 2**20:.3f} MiB ({100 * self.ratio:.1f}% of f32); quantized "
            f"kernels: {self.quantized_nbytes / 2**20:.3f} MiB "
            f"({100 * self.quantized_ratio:.1f}% of f32, "
            f"{self.quantized_bytes_per_param:.3f} B/param)")

  @property
  def quantized_bytes_per_param(self) -> float:
    """Bytes per parameter of the quantized kernels (4 x `quantized_ratio`)."""
    return 4 * self.quantized_ratio

  def table(self) -> str:
    """One line per quantized kernel: path, bytes, B/param and the copies it keeps."""
    lines = []
    for key, kept in self.copies.items():
      nbytes, f32 = self.entries[key]
      lines.append(f"{key}: {nbytes} B, {4 * nbytes / f32:.3f} B/param, {kept}")
    return "\n".join(lines)


def _is_kernel(x) -> bool:
  return isinstance(x, MXArray) or (
      isinstance(x, tuple) and bool(x) and all(isinstance(a, MXArray) for a in x))


def memory_report(variables) -> MemoryReport:
  """Counts the bytes of every array and quantized kernel in `variables`.

  Args:
    variables: any pytree of arrays and MXArrays (linen variables, an NNX module; not its
      `nnx.state`, which loses the kernels' logical shapes).

  Returns:
    A `MemoryReport` (bytes per entry and in total, against f32; `str()`: one line).

  Raises:
    TypeError: given an `nnx.State` instead of the module.
  """
  if isinstance(variables, nnx.State):
    raise TypeError("mxjax.memory_report: pass the NNX module itself, not its nnx.state: "
                    "the state holds each quantized kernel's data and scales as separate "
                    "arrays (packed FP6 / FP4 codes among them), without the logical shape "
                    "the f32 comparison needs")
  entries, copies_kept, total, f32, q_total, q_f32 = {}, {}, 0, 0, 0, 0
  leaves = jax.tree_util.tree_flatten_with_path(variables, is_leaf=_is_kernel)[0]
  for path, leaf in leaves:
    key = "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
    if _is_kernel(leaf):
      copies = leaf if isinstance(leaf, tuple) else (leaf,)
      nbytes = sum(a.nbytes for a in copies)
      nbytes_f32 = math.prod(copies[0].shape) * 4
      q_total, q_f32 = q_total + nbytes, q_f32 + nbytes_f32
      axes = ", ".join(str(a.axis) for a in copies)
      along = ("in 2-D tiles" if copies[0].format.two_d else
               f"along {'axes' if len(copies) > 1 else 'axis'} {axes}")
      copies_kept[key] = (f"{copies[0].format} {along} "
                          f"({len(copies)} cop{'ies' if len(copies) > 1 else 'y'})")
    else:
      nbytes = math.prod(jnp.shape(leaf)) * jnp.dtype(leaf.dtype).itemsize
      nbytes_f32 = math.prod(jnp.shape(leaf)) * 4
    entries[key] = (nbytes, nbytes_f32)
    total, f32 = total + nbytes, f32 + nbytes_f32
  return MemoryReport(total, f32, q_total, q_f32, entries, copies_kept)
