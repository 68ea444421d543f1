"""Sharding rules for the blockwise FFI ops: shard-local quantize, no collectives.

`blockwise_partitioned` wraps a kernel call in `custom_partitioning` with a Shardy rule
in which a blocked axis of length `n = nb * B` is the compound factor `(nb B)`: its outer
factor carries the shards of the input, the packed data and the scales alike, so each
device quantizes its own whole blocks. Every other axis passes through unchanged.

A blocked axis that cannot be split into whole blocks per shard (its length is not a
multiple of the block, the shards would cut a block, or Shardy split a mesh axis into
sub-axes to shard fewer blocks than the axis has devices) is gathered: the rule marks it
as needing replication and the partition callback asks for it unsharded. The result is
always the unsharded result; only the communication differs.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from jax._src import sharding_impls  # to decode shardings that split a mesh axis
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec


def blockwise_partitioned(call: Callable, blocked_axes: Sequence[int], block_size: int,
                          storage_per_block: int, dequantize: bool = False) -> Callable:
  """Wraps a blockwise kernel call with a sharding rule.

  Args:
    call: quantize: `x -> (data, scales) per blocked axis`; dequantize:
      `(data, scales) -> x`. It must derive every shape from its arguments, since under
      sharding it runs on each device's shard.
    blocked_axes: the quantized axis of each (data, scales) pair, counted from the end
      (quantize_2x has two).
    block_size: elements per scale, B.
    storage_per_block: data entries per block (B for FP8, 3B/4 for FP6, B/2 for FP4).
    dequantize: whether `call` is the inverse op (operands data, scales; result x).
  """
  op = custom_partitioning(call)
  op.def_partition(
      partition=_partition(call, blocked_axes, block_size, dequantize),
      decode_shardings=False,
      sharding_rule=_rule_factory(blocked_axes, block_size, storage_per_block, dequantize))
  return op


def _rule_factory(blocked_axes, block_size, storage_per_block, dequantize):
  """A Shardy rule, built per call from the operand shapes."""

  def rule(mesh, operand_types, result_types):
    del mesh
    full = (result_types[0] if dequantize else operand_types[0]).shape
    rank = len(full)
    axes = [a % rank for a in blocked_axes]
    dims = [f"d{i}" for i in range(rank)]
    replicated, sizes = [], {}
    pairs = []
    for j, a in enumerate(axes):
      n = full[a]
      if n % block_size == 0:
        dims[a] = f"(k{j} b{j})"
        data_dim, scale_dim = f"(k{j} p{j})", f"k{j}"
        sizes[f"b{j}"], sizes[f"p{j}"] = block_size, storage_per_block
      else:  # not whole blocks: three unrelated factors, all replicated
        dims[a] = f"n{j}"
        data_dim, scale_dim = f"s{j}", f"c{j}"
        replicated += [f"n{j}", f"s{j}", f"c{j}"]
      pairs.append((a, data_dim, scale_dim))
    quantized = []
    for a, data_dim, scale_dim in pairs:
      for dim in (data_dim, scale_dim):
        quantized.append(" ".join(dim if i == a else dims[i] for i in range(rank)))
    x = " ".join(dims)
    text = (f"{', '.join(quantized)} -> {x}" if dequantize else f"{x} -> {', '.join(quantized)}")
    return text, dict(need_replication_factors=tuple(replicated), **sizes)

  return rule


def _partition(call, blocked_axes, block_size, dequantize):

  def partition(mesh, arg_shapes, result_shape):
    results = result_shape if isinstance(result_shape, (tuple, list)) else (result_shape,)
    x_info = results[0] if dequantize else arg_shapes[0]
    rank = len(x_info.shape)
    spec = _spec(x_info.sharding, mesh, rank)
    for a in (a % rank for a in blocked_axes):
      shards = _shard_count(mesh, spec[a])
      if x_info.shape[a] % block_size or (x_info.shape[a] // block_size) % shards:
        spec[a] = None  # gather this axis: shards would not hold whole blocks
    sharding = NamedSharding(mesh, PartitionSpec(*spec))
    if dequantize:  # (data, scales) -> x
      return mesh, call, sharding, (sharding,) * len(arg_shapes)
    return mesh, call, (sharding,) * len(results), (sharding,)

  return partition


def _shard_count(mesh, entry) -> int:
  if entry is None:
    return 1
  names = entry if isinstance(entry, tuple) else (entry,)
  return math.prod(mesh.shape[name] for name in names)


def _spec(sharding, mesh, rank) -> list:
  """The PartitionSpec entries of a propagated sharding; all None (gather) when it splits
  a mesh axis into sub-axes (Shardy may, when a factor is smaller than the axis), which
  a PartitionSpec cannot express."""
  try:
    spec = sharding_impls.parse_flatten_op_sharding(sharding._hlo_sharding, mesh)[0]
  except ValueError:
    return [None] * rank
  return list(spec) + [None] * (rank - len(spec))
