"""Every product of an NNX model's call, through the interception core.

`mxjax.nnx.quantize` gives the model a subclass whose `__call__` runs it as a pure
function of its state through `interception.run` and writes the state back; each
submodule of the traced copy runs under a `jax.named_scope` of its attribute path
(`layers/0/attn/einsum_1`). The model keeps its state (checkpoints are unchanged).
"""

from __future__ import annotations

import functools
import threading

import jax
from flax import nnx

from mxjax._src import context, interception

_INSIDE = threading.local()


def intercept_calls(model: nnx.Module, rules) -> None:
  """Makes `model(...)` run every product through mxjax under `rules` (in place)."""
  cls = type(model)
  base = getattr(cls, "_mx_base", cls)
  object.__setattr__(model, "__class__", _intercepting_class(base))
  model._mx_rules = tuple(rules)


@functools.cache
def _intercepting_class(base: type) -> type:
  original = base.__call__

  def __call__(self, *args, mx_rng=None, **kwargs):
    recipe = context.get_recipe()
    if recipe is None or getattr(_INSIDE, "on", False):
      return original(self, *args, **kwargs)
    graphdef, state = nnx.split(self)

    def pure(state, args, kwargs):
      copy = nnx.merge(graphdef, state)
      _name_submodules(copy)
      quantized = _dequantize_stock_kernels(copy)
      _INSIDE.on = True
      try:
        out = original(copy, *args, **kwargs)
      finally:
        _INSIDE.on = False
      for variable, value in quantized:  # the state keeps them quantized
        variable.set_value(value)
      return out, nnx.state(copy)

    out, new_state = interception.run(
        pure, (state, args, kwargs), {}, recipe=recipe, rules=self._mx_rules,
        where=f"the NNX model {base.__name__}", rng=mx_rng,
        dequantize=lambda inputs: inputs)  # stock layers' MX kernels: in `pure`
    if any(jax.tree.leaves(jax.tree.map(lambda a, b: a is not b, state, new_state))):
      nnx.update(self, new_state)  # only where the call changed its state (BatchNorm, rngs)
    return out

  return _subclass(base, __call__)


@functools.cache
def _named_class(base: type, name: str) -> type:
  original = base.__call__

  def __call__(self, *args, **kwargs):
    with jax.named_scope(name):
      return original(self, *args, **kwargs)

  return _subclass(base, __call__)


def _subclass(base: type, call) -> type:
  """A subclass of `base` looking like it, with `__call__` = `call`."""
  return type(base)(base.__name__, (base,), {
      "__call__": call, "_mx_base": base, "__module__": base.__module__,
      "__doc__": base.__doc__})


def _name_submodules(model: nnx.Module) -> None:
  """Gives each submodule of `model` a class naming its calls by its path from its parent."""
  modules = {path: node for path, node in nnx.iter_graph(model)
             if isinstance(node, nnx.Module) and path
             and _has_call(type(node))}  # not nnx.List / Dict
  for path, node in modules.items():
    parent = max((p for p in modules if len(p) < len(path) and path[:len(p)] == p),
                 key=len, default=())
    base = getattr(type(node), "_mx_base", type(node))
    name = "/".join(str(p) for p in path[len(parent):])
    object.__setattr__(node, "__class__", _named_class(base, name))


def _has_call(cls: type) -> bool:
  """Whether a module class defines `__call__` (nnx.List, nnx.Dict do not)."""
  return any("__call__" in vars(c) for c in cls.__mro__[:cls.__mro__.index(nnx.Module)])


def _dequantize_stock_kernels(model: nnx.Module) -> list:
  """Dequantizes the MXArray variables of modules other than mxjax's `Linear`, for stock
  code to read; returns [(variable, its MXArray value)]."""
  from mxjax.nnx.modules import Linear  # noqa: PLC0415  (modules imports nothing of ours)
  changed = []
  for _, node in nnx.iter_graph(model):
    if not isinstance(node, nnx.Module) or isinstance(node, Linear):
      continue
    for variable in vars(node).values():
      if isinstance(variable, nnx.Variable):
        value = variable.get_value()
        plain = interception.dequantized(value)
        if plain is not value:
          changed.append((variable, value))
          variable.set_value(plain)
  return changed
