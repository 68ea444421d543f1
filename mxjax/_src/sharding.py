"""Sharding rules for the blockwise kernel calls: shard-local quantize, no collectives.

`blockwise_partitioned` gives a kernel call one rule per kind of mesh axis:

- Auto axes (the partitioner propagates shardings): `custom_partitioning` with a Shardy
  rule in which a blocked axis of length `n = nb * B` is the compound factor `(nb B)`: its
  outer factor carries the shards of the input, the packed data and the scales alike, so
  each device quantizes its own whole blocks. Every other axis passes through unchanged.
  The partition callback reads the partitioner's shardings through public `Sharding`
  methods only (`shard_shape`, `is_equivalent_to`).
- Explicit axes (the sharding is in the operand's type, under `jax.set_mesh`): the call
  runs under `jax.shard_map` over the axes the operand's type names, with specs read from
  it, so the results carry the operand's sharding in their types (also under `vmap`).

`max_over_shards` gives a reduction to a scalar (the tensor amax) the same two kinds of
rules: each device reduces its own shard, then one `lax.pmax` over the sharded axes.
A blockwise call can take a counter on the global index (`index_strides`: stochastic
rounding's bits): each device quantizes its own whole blocks with the bits of their
global indices, its counter's base moved to its shard's first index.

`leaf_specs` says how each array of an MXArray (or a pair) is stored when its tensor is
sharded as a PartitionSpec names (Flax's kernel annotations).

`merge_dims` / `split_dim` say how a reshape that merges or splits dims keeps their
shards in place; `mxjax.dot` uses them for its canonical form.

Inside `jax.shard_map` (manual axes), `vary_alike` gives a product's operands one type, as
`lax.dot_general` does itself, so a `custom_vjp` returns cotangents of its primals' types.

A blocked axis that cannot be split into whole blocks per shard (its length is not a
multiple of the block, or the shards would cut a block) is gathered: the rule marks it as
needing replication (Auto) or reshards the operand (Explicit) before the call. The result
is always the unsharded result; only the communication differs.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from mxjax._src.mxarray import MXArray


#: What a blockwise call maps: x to (data, scales) pairs, a pair to x, or x to x.
CALL_KINDS = ("quantize", "dequantize", "fake_quantize")


def blockwise_partitioned(call: Callable, blocked_axes: Sequence[int], block_size: int,
                          storage_per_block: int, kind: str = "quantize",
                          index_strides: Sequence[int] | None = None) -> Callable:
  """Wraps a blockwise kernel call with its sharding rules (Auto and Explicit axes).

  Args:
    call: by `kind`: quantize `x -> (data, scales) per blocked axis`; dequantize
      `(data, scales) -> x`; fake_quantize `x -> x` (quantized and dequantized). It must
      derive every shape from its arguments, since under sharding it runs on each
      device's shard. Operands after those may follow: one of x's shape is sharded as
      x (stochastic-rounding bits), one of rank 1 that is not is replicated (a tensor
      scale).
    blocked_axes: the quantized axis of each (data, scales) pair, counted from the end
      (quantize_2x has two).
    block_size: elements per scale, B.
    storage_per_block: data entries per block (B for FP8, 3B/4 for FP6, B/2 for FP4).
    kind: one of CALL_KINDS.
    index_strides: where given, operand 1 is a counter (uint32[3]: seed, seed, base,
      replicated) of stochastic-rounding bits of each element's index `base + sum_d i_d *
      index_strides[d]`: each shard's base is moved to its first element's index.
  """
  if kind not in CALL_KINDS:
    raise ValueError(f"blockwise_partitioned: kind must be one of {CALL_KINDS}, got {kind!r}")
  dequantize = kind != "quantize"  # the result is x-shaped
  leading = _leading(kind, len(blocked_axes))
  op = custom_partitioning(call)
  op.def_partition(
      partition=_partition(call, blocked_axes, block_size, dequantize, leading,
                           index_strides),
      decode_shardings=False,
      sharding_rule=_rule_factory(blocked_axes, block_size, storage_per_block, kind))

  def run(*args):
    spec = typed_spec(args[0])
    if spec is None:  # no Explicit axis in the operand's type: Shardy's rule applies
      return op(*args)
    return _shard_local(op, call, args, spec, blocked_axes, block_size, dequantize, leading,
                        index_strides)

  return run


# ---------------------------------------------------------------------------------------
# Explicit axes: the sharding is in the types.


def typed_spec(x) -> tuple | None:
  """The PartitionSpec entries (one per dim) in x's type, or None when its type names no
  mesh axis (unsharded, or sharded over Auto axes only)."""
  aval = jax.typeof(x)
  spec = tuple(aval.sharding.spec)
  spec += (None,) * (aval.ndim - len(spec))
  return spec if any(entry is not None for entry in spec) else None


def explicit_sharding(x):
  """The NamedSharding in x's type when its mesh has Explicit axes (even if x is
  replicated over them), else None."""
  named = jax.typeof(x).sharding
  if jax.sharding.AxisType.Explicit not in getattr(named.mesh, "axis_types", ()):
    return None
  return named


def shard_count(mesh, entry) -> int:
  """Devices a PartitionSpec entry (None, an axis name or a tuple of them) splits over."""
  return math.prod(mesh.shape[name] for name in axis_names(entry))


def _whole_blocks(length: int, block_size: int, shards: int) -> bool:
  return shards == 1 or (length % block_size == 0 and (length // block_size) % shards == 0)


def axis_names(entry) -> tuple:
  """The mesh axes of a PartitionSpec entry (None, an axis name or a tuple of them)."""
  return () if entry is None else entry if isinstance(entry, tuple) else (entry,)


def _entry(names: Sequence[str]):
  return None if not names else names[0] if len(names) == 1 else tuple(names)


def leaf_specs(value, entries: Sequence, counts: Sequence[int | None]):
  """The PartitionSpec of each array of `value` (an MXArray, a pair of them, or arrays,
  concrete or abstract) whose tensor's dims are sharded as `entries` (mesh axes or
  logical names), as a pytree like `value`.

  jax stores only even shards. A dim as long as the tensor's keeps its entry: it splits
  wherever the high-precision tensor's does. A shorter one (the scales along the blocks,
  packed FP6 / FP4 codes) keeps it only where it splits evenly into `counts[d]` shards
  (None: not known, kept) and is replicated otherwise. The data keeps the tensor's
  sharding even where its shards cut blocks (the ops gather those first).
  """
  def spec(a, full):
    return PartitionSpec(*(e if e is None or n == m or k is None or n % k == 0 else None
                           for e, n, m, k in zip(entries, a.shape, full, counts)))

  def specs(x):
    if isinstance(x, MXArray):  # a tensor scale (a scalar) is replicated
      return dataclasses.replace(x, data=spec(x.data, x.shape), scales=spec(x.scales, x.shape),
                                 tensor_scale=None if x.tensor_scale is None else PartitionSpec())
    return spec(x, x.shape)

  return jax.tree.map(specs, value, is_leaf=lambda x: isinstance(x, MXArray))


def merge_dims(entries: Sequence, sizes: Sequence[int], mesh) -> tuple[list, object]:
  """How consecutive dims of `sizes`, sharded as `entries`, merge into one dim in place.

  Returns (entries the dims must have first, the merged dim's entry). The merged dim's
  shards are contiguous when every dim before the first one holding several indices per
  shard is split down to single indices and every dim after it is unsharded; sharded dims
  after it are gathered (the first entries then differ from `entries`).
  """
  kept, names, wide = [], [], False
  for entry, size in zip(entries, sizes):
    if wide and entry is not None:
      kept.append(None)
      continue
    kept.append(entry)
    names += axis_names(entry)
    wide = wide or size // shard_count(mesh, entry) > 1
  return kept, _entry(names)


def split_dim(entry, sizes: Sequence[int], mesh) -> list | None:
  """The entries of the dims `sizes` that a dim sharded as `entry` splits into in place
  (the inverse of `merge_dims`); None when its shards do not fall on whole slices."""
  names, out = list(axis_names(entry)), []
  for size in sizes:
    taken = []
    while names and size % (shard_count(mesh, tuple(taken)) * mesh.shape[names[0]]) == 0:
      taken.append(names.pop(0))
      if shard_count(mesh, tuple(taken)) == size:
        break
    out.append(_entry(taken))
    if shard_count(mesh, tuple(taken)) < size and names:
      return None  # this dim keeps several indices per shard: the rest cannot be split off
  return None if names else out


def unshared_contraction(spec: Sequence, other: Sequence, contract: int, other_contract: int,
                         length: int, block_size: int, mesh) -> tuple | None:
  """The entries an operand of a product should have first when its contracted dim is
  split over a mesh axis that the other operand uses for one of its own other dims (as
  FSDP shards a weight's contraction over the axis that splits the batch); None when it
  is not.

  `jnp.dot` leaves that conflict to the partitioner, which moves the weight slice each
  product reads. A quantized product reads two quantizations of the weight (along K in
  the forward, along its free dim in the dgrad), which it would move twice; moved first,
  in high precision, the weight moves once and both are made where it lands. The
  contraction goes to the other operand's contraction axes, or else to the mesh axes
  neither operand uses (each device slices its replicated copy of the other operand), or
  is gathered where those would cut blocks.

  Args:
    spec, other: the two operands' PartitionSpec entries, one per dim.
    contract, other_contract: their contracted dims.
    length: the contracted dim's length; block_size: B.
  """
  names = lambda entries, skip: {n for i, e in enumerate(entries) if i != skip  # noqa: E731
                                 for n in axis_names(e)}
  contract, other_contract = contract % len(spec), other_contract % len(other)
  if not set(axis_names(spec[contract])) & names(other, other_contract):
    return None
  own = names(spec, contract)
  target = other[other_contract]
  if target is None:
    used = own | names(other, None)
    target = _entry([n for n, t in zip(mesh.axis_names, mesh.axis_types)
                     if n not in used and mesh.shape[n] > 1
                     and t == jax.sharding.AxisType.Explicit])
  if set(axis_names(target)) & own or not _whole_blocks(length, block_size,
                                                     shard_count(mesh, target)):
    target = None
  return (*spec[:contract], target, *spec[contract + 1:])


def _shard_local(op, call, args, spec, blocked_axes, block_size, dequantize, leading,
                 index_strides):
  """`op(*args)` run per shard under `jax.shard_map`. Each (data, scales) pair comes from
  a call whose operand keeps its sharding, except along that pair's blocked axis when
  shards would cut blocks there (gathered first)."""
  mesh = jax.typeof(args[0]).sharding.mesh
  global_args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
  x_shape = jax.eval_shape(call, *global_args).shape if dequantize else args[0].shape
  rank = len(x_shape)
  pair_specs = []
  for a in (a % rank for a in blocked_axes):
    pair_spec = list(spec)
    if not _whole_blocks(x_shape[a], block_size, shard_count(mesh, spec[a])):
      pair_spec[a] = None
    pair_specs.append(PartitionSpec(*pair_spec))

  def sharded_call(pspec, n_results):
    """The kernel call per shard of the operands resharded to `pspec`; the axes `pspec`
    names turn manual. Over the mesh's other axes the operands are replicated (Explicit,
    by their types) or sharded as the partitioner propagates (Auto axes of a mixed mesh:
    the Shardy rule of `op` applies to them inside)."""
    specs = tuple(pspec if i < leading or a.shape == x_shape else PartitionSpec()
                  for i, a in enumerate(args))
    operands = [jax.sharding.reshard(a, NamedSharding(mesh, s)) for a, s in zip(args, specs)]
    names, fn = _manual_call(op, call, mesh, pspec)
    if not names:
      return op(*operands)
    fn = _from_shard_base(fn, pspec, _shard_shape(x_shape, mesh, pspec), index_strides)
    return jax.shard_map(fn, mesh=mesh, in_specs=specs,
                         out_specs=pspec if n_results is None else (pspec,) * n_results,
                         axis_names=names)(*operands)

  if dequantize:
    return sharded_call(pair_specs[0], None)
  results = [None] * (2 * len(pair_specs))
  for pspec in dict.fromkeys(pair_specs):  # one call per distinct operand sharding
    outs = sharded_call(pspec, len(results))
    for j, pair_spec in enumerate(pair_specs):
      if pair_spec == pspec:
        results[2 * j:2 * j + 2] = outs[2 * j:2 * j + 2]
  return tuple(results)


def _manual_call(op, local, mesh, spec) -> tuple[set, Callable]:
  """(the mesh axes `spec` names, the call to run under `jax.shard_map` over them): `op`
  (its Shardy rule) where `mesh` has Auto axes of more than one device besides those,
  else `local`."""
  names = {name for entry in spec for name in axis_names(entry)}
  auto_left = any(t == jax.sharding.AxisType.Auto and mesh.shape[name] > 1
                  for name, t in zip(mesh.axis_names, mesh.axis_types) if name not in names)
  return names, op if auto_left else local


# ---------------------------------------------------------------------------------------
# Reductions to a scalar: each shard's, then the max over the shards.


def max_over_shards(local: Callable, whole: tuple[int, int] | None = None) -> Callable:
  """`local` (x -> a uint32 scalar that a max over parts of x gives, as the amax) with
  sharding rules for Auto and Explicit axes: each device reduces its own shard, then one
  `lax.pmax` over the mesh axes x is sharded over (an all-reduce of a scalar). `whole` =
  (axis, n): shards hold whole runs of n along the axis (else it is gathered)."""

  def pmaxed(fn, spec):
    names = tuple(name for entry in spec for name in axis_names(entry))
    return (lambda x: jax.lax.pmax(fn(x), names)) if names else fn

  def runs_whole(spec, shape, mesh):
    spec = list(spec)
    if whole is not None:
      axis, n = whole
      if spec[axis] is not None and not _whole_blocks(shape[axis], n,
                                                      shard_count(mesh, spec[axis])):
        spec[axis] = None
    return tuple(spec)

  def partition(mesh, arg_shapes, result_shape):
    del result_shape
    shape = arg_shapes[0].shape
    spec = spec_over_mesh(arg_shapes[0].sharding, mesh, len(shape)) or (None,) * len(shape)
    spec = runs_whole(spec, shape, mesh)
    return (mesh, pmaxed(local, spec), NamedSharding(mesh, PartitionSpec()),
            (NamedSharding(mesh, PartitionSpec(*spec)),))

  op = custom_partitioning(local)
  op.def_partition(partition=partition, decode_shardings=False,
                   sharding_rule=lambda mesh, operands, results: " ".join(
                       f"d{i}" for i in range(len(operands[0].shape))) + " ->")

  def run(x):
    spec = typed_spec(x)
    if spec is None:  # no Explicit axis in x's type: the rule above applies
      return op(x)
    mesh = jax.typeof(x).sharding.mesh
    if (kept := runs_whole(spec, x.shape, mesh)) != tuple(spec):
      x, spec = jax.sharding.reshard(x, NamedSharding(mesh, PartitionSpec(*kept))), kept
    names, fn = _manual_call(op, local, mesh, spec)
    return jax.shard_map(pmaxed(fn, spec), mesh=mesh,
                         in_specs=PartitionSpec(*spec), out_specs=PartitionSpec(),
                         axis_names=names)(x)

  return run


# ---------------------------------------------------------------------------------------
# Counters on the global index: each shard's from its first index.


def _shard_shape(shape, mesh, spec) -> list[int]:
  """A shard's shape (uneven shards are padded to the longest)."""
  return [-(-n // shard_count(mesh, entry)) for n, entry in zip(shape, spec)]


def _from_shard_base(fn: Callable, spec, local_shape, strides) -> Callable:
  """`fn` whose operand 1 ends with a counter's base (uint32), moved to this shard's first
  index: the shard's position along each sharded dim times its length there times the
  dim's stride, modulo 2^32. `fn` itself where `strides` is None."""
  if strides is None:
    return fn

  def run(x, counter, *rest):
    base = jnp.zeros((), jnp.uint32)
    for d, entry in enumerate(spec):
      if axis_names(entry):
        step = jnp.uint32(local_shape[d] * strides[d] % 2 ** 32)
        base = base + jax.lax.axis_index(axis_names(entry)).astype(jnp.uint32) * step
    return fn(x, counter.at[-1].add(base), *rest)

  return run


# ---------------------------------------------------------------------------------------
# Auto axes: a Shardy rule and the partition callback.


def _leading(kind: str, pairs: int) -> int:
  """The operands of a `kind` call before any extra ones: x, or dequantize's pairs."""
  return 2 * pairs if kind == "dequantize" else 1


def _rule_factory(blocked_axes, block_size, storage_per_block, kind):
  """A Shardy rule, built per call from the operand shapes."""

  def rule(mesh, operand_types, result_types):
    del mesh
    full = (result_types[0] if kind == "dequantize" else operand_types[0]).shape
    rank = len(full)
    axes = [a % rank for a in blocked_axes]
    dims = [f"d{i}" for i in range(rank)]
    replicated, sizes = [], {}
    pairs = []
    for j, a in enumerate(axes):
      n = full[a]
      if n % block_size == 0 and n > block_size:  # Shardy wants compound factors above 1
        dims[a] = f"(k{j} b{j})"
        data_dim, scale_dim = f"(k{j} p{j})", f"k{j}"
        sizes[f"b{j}"], sizes[f"p{j}"] = block_size, storage_per_block
        if kind == "fake_quantize":  # no scale dim names k alone: its size is not inferred
          sizes[f"k{j}"] = n // block_size
        replicated += [f"b{j}", f"p{j}"]  # a shard never splits a block
      else:  # not several whole blocks: three unrelated factors, all replicated
        dims[a] = f"n{j}"
        data_dim, scale_dim = f"s{j}", f"c{j}"
        replicated += [f"n{j}", f"s{j}", f"c{j}"]
      pairs.append((a, data_dim, scale_dim))
    quantized = []
    for a, data_dim, scale_dim in pairs:
      for dim in (data_dim, scale_dim):
        quantized.append(" ".join(dim if i == a else dims[i] for i in range(rank)))
    x = " ".join(dims)
    extras = []
    for i, t in enumerate(operand_types[_leading(kind, len(pairs)):]):
      if tuple(t.shape) == tuple(full):
        extras.append(x)
      else:  # rank 1 (see blockwise_partitioned): replicated
        extras.append(f"t{i}")
        replicated.append(f"t{i}")
    operands = ", ".join([x if kind != "dequantize" else ", ".join(quantized), *extras])
    text = {"quantize": f"{operands} -> {', '.join(quantized)}",
            "dequantize": f"{operands} -> {x}",
            "fake_quantize": f"{operands} -> {x}"}[kind]
    named = set(re.findall(r"\w+", text))  # fake_quantize names no data or scale factor
    replicated = [f for f in replicated if f in named]
    sizes = {f: size for f, size in sizes.items() if f in named}
    return text, dict(need_replication_factors=in_rule_order(replicated, text), **sizes)

  return rule


def in_rule_order(factors: Sequence[str], rule: str) -> tuple[str, ...]:
  """`factors` in the order they first appear in `rule`: Shardy numbers the factors of a
  rule that way and needs each list of special factors sorted by that number."""
  order = {name: i for i, name in enumerate(dict.fromkeys(re.findall(r"\w+", rule)))}
  return tuple(sorted(factors, key=order.__getitem__))


def _partition(call, blocked_axes, block_size, dequantize, leading, index_strides):

  def partition(mesh, arg_shapes, result_shape):
    results = result_shape if isinstance(result_shape, (tuple, list)) else (result_shape,)
    x_info = results[0] if dequantize else arg_shapes[0]
    rank = len(x_info.shape)
    axes = [a % rank for a in blocked_axes]
    sharding = x_info.sharding
    if not _holds_whole_blocks(sharding, x_info.shape, axes, block_size):
      sharding = _gathered(sharding, mesh, x_info.shape, axes, block_size)
    fn = call
    if index_strides is not None:  # a counter's shards need their places as mesh axes
      spec = spec_over_mesh(sharding, mesh, rank) or (None,) * rank
      sharding = NamedSharding(mesh, PartitionSpec(*spec))
      fn = _from_shard_base(call, spec, _shard_shape(x_info.shape, mesh, spec), index_strides)
    args = tuple(sharding if i < leading or tuple(a.shape) == tuple(x_info.shape)
                 else NamedSharding(mesh, PartitionSpec()) for i, a in enumerate(arg_shapes))
    if dequantize:  # (data, scales) -> x
      return mesh, fn, sharding, args
    return mesh, fn, (sharding,) * len(results), args

  return partition


def _holds_whole_blocks(sharding, shape, axes, block_size) -> bool:
  """Whether every shard of `shape` holds whole blocks along each of `axes` (or all of it)."""
  try:
    local = sharding.shard_shape(tuple(shape))
  except ValueError:  # an uneven sharding
    return False
  return all(local[a] == shape[a] or (shape[a] % block_size == 0 and local[a] % block_size == 0)
             for a in axes)


def _gathered(sharding, mesh, shape, axes, block_size) -> NamedSharding:
  """`sharding` with the blocked `axes` that cut blocks gathered; all of it gathered when
  it is no PartitionSpec over `mesh` (Shardy may split a mesh axis into sub-axes)."""
  spec = spec_over_mesh(sharding, mesh, len(shape))
  if spec is None:
    return NamedSharding(mesh, PartitionSpec())
  spec = list(spec)
  for a in axes:
    if not _whole_blocks(shape[a], block_size, shard_count(mesh, spec[a])):
      spec[a] = None
  return NamedSharding(mesh, PartitionSpec(*spec))


def spec_over_mesh(sharding, mesh, ndim: int) -> tuple | None:
  """The PartitionSpec entries over `mesh` equivalent to `sharding` (any `jax.sharding.
  Sharding`), found among the ways to give each mesh axis to a dim; None if there is none."""
  names = [name for name in mesh.axis_names if mesh.shape[name] > 1]
  for size in range(len(names) + 1):  # fewest sharded axes first: replicated is common
    for used in itertools.permutations(names, size):
      for dims in itertools.product(range(ndim), repeat=size):
        spec = [()] * ndim
        for name, d in zip(used, dims):
          spec[d] += (name,)
        entries = tuple(None if not e else e[0] if len(e) == 1 else e for e in spec)
        if sharding.is_equivalent_to(NamedSharding(mesh, PartitionSpec(*entries)), ndim):
          return entries
  return None


# ---------------------------------------------------------------------------------------
# Manual axes (jax.shard_map with check_vma): which mesh axes a value varies over.


def varying_axes(x) -> frozenset:
  """The manual mesh axes x's type varies over: empty outside `jax.shard_map` and under
  `check_vma=False`."""
  return frozenset(jax.typeof(x).manual_axis_type.varying)


def vary_over(tree, axes: frozenset):
  """`tree` (of arrays), each leaf made to vary over the manual mesh axes `axes` too
  (`jax.lax.pcast(..., to="varying")`); the leaves as given where they already do."""
  def vary(leaf):
    missing = axes - varying_axes(leaf)
    return jax.lax.pcast(leaf, tuple(missing), to="varying") if missing else leaf

  return jax.tree.map(vary, tree) if axes else tree


def vary_alike(*operands):
  """The operands (pytrees of arrays), each leaf made to vary over every manual mesh axis
  any leaf varies over, as `lax.dot_general` makes its operands under `jax.shard_map`.
  The transpose of that cast psums the cotangent over the axes it added, so a `custom_vjp`
  of the results, whose backward makes cotangents as varying as its operands, hands a
  replicated operand its summed, replicated gradient. Returns the operands as given where
  nothing varies (outside shard_map, check_vma=False).
  """
  return vary_over(operands, frozenset().union(*map(varying_axes, jax.tree.leaves(operands))))
