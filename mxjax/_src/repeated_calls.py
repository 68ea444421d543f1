"""A stateful (DelayedScaling) layer called several times in one forward: a shared layer
(`d(d(x))`), a recurrent cell unrolled in Python. Every call runs on the state the forward
started with.

The modules store each call's forward record in the layer's state, where the layer's next
call reads it. A call that finds there the very record (the same arrays) that the layer's
previous call in the same forward stored runs on the state that call started from
instead: its scales then do not come from the earlier call's amaxes (which a larger input
would saturate against), and its gradient (its next state) reaches the state the step
started with, so the overwrite counts each call as a use (`mxjax.state.settle`). The
record it stores merges the calls' (`mxjax.state.merge_records`).

What one forward is: a linen `apply` (its root scope); for NNX, one run of a transform
(`nnx.jit`, `nnx.grad`, ...), which calls a copy of the module on traced values. An NNX
module called eagerly, outside any transform, cannot tell one forward from the next: each
call there reads the record the call before it stored.
"""

from __future__ import annotations

import weakref
from typing import Any, Hashable

import jax

# id(forward) -> (weak reference to it, {layer key: (leaves of the record stored, the state
# the forward started from)}). An entry goes with its forward.
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
  """(state to run the call with, whether it is a repeated call): the state the layer's
  first call in `forward` started from where `stored` is the record the layer's previous
  call stored; else `stored`."""
  entry = _layers(forward, create=False).get(layer)
  if entry is not None and _same_arrays(entry[0], stored):
    return entry[1], True
  return stored, False


def note_record(forward, layer: Hashable, start, record) -> None:
  """Notes that the layer's call in `forward` stored `record`, the forward having started
  from `start`."""
  _layers(forward, create=True)[layer] = (jax.tree.leaves(record), start)


def traced(state) -> bool:
  """Whether `state`'s arrays are traced values (inside a transform)."""
  return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(state))


def _same_arrays(leaves: list, tree) -> bool:
  other = jax.tree.leaves(tree)
  return bool(leaves) and len(leaves) == len(other) and all(
      a is b for a, b in zip(leaves, other))
