"""The canonical form of a contraction (`mxjax.dot_general`, `mxjax.einsum`): `lhs [*B, M, K]`,
`rhs [*B, K, N]`, batch dims kept, free and contracting dims each merged, in
`lax.dot_general`'s output order. Under Explicit mesh axes merges and splits keep the shards
in place (`sharding.merge_dims` / `split_dim`; a dim that cannot is gathered first).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from mxjax._src import sharding


@dataclasses.dataclass(frozen=True)
class Layout:
  """How one operand maps to its canonical form: `[*B, M, K]` for lhs, `[*B, K, N]` for rhs."""

  shape: tuple[int, ...]
  batch: tuple[int, ...]
  free: tuple[int, ...]
  contract: tuple[int, ...]
  contract_first: bool  # rhs: [*B, K, N]

  @property
  def groups(self) -> tuple[tuple[int, ...], ...]:
    """The operand's dims per canonical dim: each batch dim alone, then M / K or K / N."""
    middle = (self.contract, self.free) if self.contract_first else (self.free, self.contract)
    return (*((d,) for d in self.batch), *middle)

  @property
  def perm(self) -> tuple[int, ...]:
    return sum(self.groups, ())

  @property
  def contract_axis(self) -> int:
    """Where K sits in the canonical form, from the end (-2 or -1)."""
    return -2 if self.contract_first else -1

  @property
  def free_axis(self) -> int:
    return -3 - self.contract_axis

  def sizes(self, dims) -> tuple[int, ...]:
    return tuple(self.shape[d] for d in dims)

  def to_canonical(self, x: jax.Array) -> jax.Array:
    return merge_groups(jnp.transpose(x, self.perm), [len(g) for g in self.groups])

  def from_canonical(self, x: jax.Array) -> jax.Array:
    x = split_groups(x, [self.sizes(g) for g in self.groups])
    return jnp.transpose(x, np.argsort(self.perm))

  def canonical_sharding(self, primal_sharding):
    """The canonical form's sharding of an operand sharded as `primal_sharding` (or None)."""
    if primal_sharding is None:
      return None
    spec = padded_spec(primal_sharding, len(self.shape))
    transposed = NamedSharding(primal_sharding.mesh, PartitionSpec(*(spec[d] for d in self.perm)))
    return merged_sharding(transposed, self.sizes(self.perm), [len(g) for g in self.groups])


def padded_spec(named: NamedSharding, ndim: int) -> tuple:
  spec = tuple(named.spec)
  return spec + (None,) * (ndim - len(spec))


def merged_sharding(named: NamedSharding | None, shape, lengths: Sequence[int]):
  """The sharding of an array sharded as `named` once runs of `lengths` dims are merged."""
  if named is None:
    return None
  spec, starts = padded_spec(named, len(shape)), np.cumsum([0, *lengths]).tolist()
  merged = [sharding.merge_dims(spec[a:b], shape[a:b], named.mesh)[1]
            for a, b in zip(starts, starts[1:])]
  return NamedSharding(named.mesh, PartitionSpec(*merged))


def merge_groups(x: jax.Array, lengths: Sequence[int]) -> jax.Array:
  """x with each run of `lengths` consecutive dims merged into one, keeping shards."""
  starts = np.cumsum([0, *lengths]).tolist()
  shape = tuple(math.prod(x.shape[a:b]) for a, b in zip(starts, starts[1:]))
  spec = sharding.typed_spec(x)
  if spec is None:
    return x.reshape(shape)
  mesh = jax.typeof(x).sharding.mesh
  kept, merged = [], []
  for a, b in zip(starts, starts[1:]):
    entries, entry = sharding.merge_dims(spec[a:b], x.shape[a:b], mesh)
    kept += entries
    merged.append(entry)
  if tuple(kept) != spec:
    x = jax.sharding.reshard(x, NamedSharding(mesh, PartitionSpec(*kept)))
  return jnp.reshape(x, shape, out_sharding=NamedSharding(mesh, PartitionSpec(*merged)))


def split_groups(x: jax.Array, sizes: Sequence[Sequence[int]]) -> jax.Array:
  """x with dim i split into dims of `sizes[i]`, keeping shards."""
  shape = tuple(d for group in sizes for d in group)
  spec = sharding.typed_spec(x)
  if spec is None:
    return x.reshape(shape)
  mesh = jax.typeof(x).sharding.mesh
  kept, split = list(spec), []
  for i, (entry, group) in enumerate(zip(spec, sizes)):
    entries = sharding.split_dim(entry, group, mesh)
    if entries is None:
      kept[i], entries = None, [None] * len(group)
    split += entries
  if tuple(kept) != spec:
    x = jax.sharding.reshard(x, NamedSharding(mesh, PartitionSpec(*kept)))
  return jnp.reshape(x, shape, out_sharding=NamedSharding(mesh, PartitionSpec(*split)))


def layout(shape, contract, batch, name, contract_first: bool) -> Layout:
  ndim = len(shape)
  dims = [int(d) % ndim if -ndim <= d < ndim else None for d in (*contract, *batch)]
  if None in dims or len(set(dims)) != len(dims):
    raise ValueError(f"mxjax.dot_general: bad dimension numbers for {name} of shape {shape}: "
                     f"contracting {tuple(contract)}, batch {tuple(batch)}")
  contract, batch = tuple(dims[:len(contract)]), tuple(dims[len(contract):])
  if not contract:
    raise ValueError("mxjax.dot_general needs at least one contracting dimension to block")
  free = tuple(d for d in range(ndim) if d not in contract and d not in batch)
  return Layout(tuple(shape), batch, free, contract, contract_first)
