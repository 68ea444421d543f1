"""The order a call of an NNX model runs its GEMM layers' products (`gemm_paths` with
inputs): the call traced once, abstractly, on a copy of the model whose products note
their layer as they run."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable

import jax
from flax import nnx

# While a call is traced: ({id(layer): path}, the paths in the order the products ran).
_RECORDING: contextvars.ContextVar = contextvars.ContextVar("mxjax_nnx_call_order",
                                                            default=None)


def note(layer) -> None:
  """Notes that `layer`'s product runs (a no-op outside `traced_order`)."""
  recording = _RECORDING.get()
  if recording is not None and id(layer) in recording[0]:
    recording[1].append(recording[0][id(layer)])


def _noting(layer, product: Callable) -> Callable:
  def run(*args, **kwargs):
    note(layer)
    return product(*args, **kwargs)
  return run


def traced_order(model: nnx.Module, layers: Callable, call: Callable) -> list[str]:
  """The paths of `model`'s GEMM layers in the order `call(model)` runs their products,
  each once; nothing is computed (`jax.eval_shape`), and `model` is left as it was.

  Args:
    layers: `model -> [(path, layer, product attribute or None)]`: a product attribute
      ("dot_general", "einsum_op") is wrapped to note its layer; None: the layer notes
      itself (`note`).
    call: `model -> outputs`.
  """
  graphdef, state = nnx.split(model)
  order: list[str] = []

  def run(state):
    copy = nnx.merge(graphdef, state)
    paths = {}
    for path, layer, attr in layers(copy):
      paths[id(layer)] = path
      if attr is not None:
        product = getattr(layer, attr)
        default = jax.lax.dot_general if attr == "dot_general" else None
        object.__setattr__(layer, attr, _noting(layer, product or default))
    token = _RECORDING.set((paths, order))
    try:
      return call(copy)
    finally:
      _RECORDING.reset(token)

  jax.eval_shape(run, state)
  return list(dict.fromkeys(order))
