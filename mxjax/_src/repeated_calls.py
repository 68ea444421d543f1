"""A stateful (DelayedScaling) layer called several times in one forward (`d(d(x))`):
every call runs on the state the forward started with.

A call that finds in the layer's state the very record (the same arrays) its previous
call in the same forward stored runs on the state that call started from, so its scales
ignore the earlier amaxes and the overwrite counts each call as a use; its record merges
the calls' (`mxjax.state.merge_records`). One forward: a linen `apply`; for NNX, one run
of a transform (eager NNX calls cannot tell forwards apart).
"""

from __future__ import annotations

import weakref
from typing import Any, Hashable

import jax

# id(forward) -> (weakref to it, {layer: (leaves of the record stored, the start state)}).
_FORWARDS: dict[int, tuple[weakref.ref, dict]] = {}


def _layers(forward, create: bool) -> dict:
  """`forward`'s layers' notes ({} and nothing kept where it has none and not `create`)."""
  key = id(forward)
  entry = _FORWARDS.get(key)
  if entry is None or entry[0]() is not forward:
    if not create:
      return {}
    entry = (weakref.ref(forward, lambda _, key=key: _FORWARDS.pop(key, None)), {})
    _FORWARDS[key] = entry
  return entry[1]


def started_from(forward, layer: Hashable, stored) -> tuple[Any, bool]:
  """(state to run the call with, whether it repeats): the first call's start where
  `stored` is the record the layer's previous call in `forward` stored, else `stored`."""
  entry = _layers(forward, create=False).get(layer)
  if entry is not None and _same_arrays(entry[0], stored):
    return entry[1], True
  return stored, False


def note_record(forward, layer: Hashable, start, record) -> None:
  """Notes that the layer's call in `forward` (started from `start`) stored `record`."""
  _layers(forward, create=True)[layer] = (jax.tree.leaves(record), start)


def traced(state) -> bool:
  """Whether `state`'s arrays are traced values (inside a transform)."""
  return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(state))


def _same_arrays(leaves: list, tree) -> bool:
  other = jax.tree.leaves(tree)
  return bool(leaves) and len(leaves) == len(other) and all(
      a is b for a, b in zip(leaves, other))
