"""MX for NNX models, unchanged: `quantize(model, rules)` and `gemm_paths(model)`.

    mxjax.nnx.quantize(model, rules=[(r"lm_head", None)])
    with mxjax.autocast(recipe=mxjax.MXFP8BlockScaling()):
      loss, grads = nnx.value_and_grad(loss_fn)(model, batch)

`quantize` gives every stock `nnx.Linear` / `nnx.LinearGeneral` an MX `dot_general` and
every `nnx.Einsum` an MX `einsum_op` (static attributes named by the layer's graph path),
and runs every other product of the model's `__call__` through the interception core
(`mxjax.nnx.every_product`); `nnx.state(model)` is unchanged, and with autocast off the
model makes exactly the stock calls. Per-tensor state (DelayedScaling) has no place in an
unchanged `nnx.state`: such a layer raises (`mxjax.nnx.Linear` keeps the state).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from flax import nnx
from jax import lax

from mxjax._src import rules as rules_lib, state as state_lib
from mxjax._src import projection, context, products
from mxjax._src.einsum import einsum_as_dot_general
from mxjax.nnx import every_product
from mxjax.nnx.modules import AUTOCAST, Linear
from mxjax._src.recipes import MXFP8BlockScaling, Recipe


@dataclasses.dataclass(frozen=True)
class MXProduct:
  """The MX `dot_general` (or `einsum_op`) of one layer: a hashable static attribute.

  Attributes:
    path: the layer's graph path, for rules and errors.
    recipe: the rule's recipe, or "autocast" (the autocast recipe at call time).
    einsum: called as `einsum_op(subscripts, a, b, ...)`, else as `dot_general`.
  """

  path: str
  recipe: Recipe | str
  einsum: bool = False

  def __call__(self, *args, precision=None, preferred_element_type=None, out_sharding=None,
               **kwargs):
    autocast = context.get_recipe()
    if autocast is None:  # exactly the stock call
      stock = jnp.einsum if self.einsum else lax.dot_general
      return stock(*args, precision=precision, preferred_element_type=preferred_element_type,
                   out_sharding=out_sharding, **kwargs)
    recipe = autocast if self.recipe == AUTOCAST else self.recipe
    if recipe.stateful():
      raise ValueError(
          f"mxjax.nnx.quantize: layer '{self.path}' runs {type(recipe).__name__}, which keeps "
          "per-tensor state that an unchanged nnx.state cannot hold. Use a stateless recipe "
          "(MX block scaling, Float8CurrentScaling) for it, a rule (pattern, None), or "
          "mxjax.nnx.Linear, which keeps the state.")

    def dot(lhs, rhs, dims, out_sharding=None):
      dtype = jnp.dtype(preferred_element_type or jnp.result_type(lhs, rhs))
      return projection.project(lhs, rhs, recipe, state_lib.init(recipe), dtype=dtype,
                           where=f"layer '{self.path}'", dimension_numbers=dims,
                           out_sharding=out_sharding, path=self.path)[0]

    if self.einsum:
      return einsum_as_dot_general(*args, dot, out_sharding)
    return dot(*args, out_sharding=out_sharding)


def _stock_product(layer) -> tuple[str, object] | None:
  """(attribute, its stock value) of a layer's product, or None for other nodes."""
  if isinstance(layer, nnx.Einsum):
    return "einsum_op", jnp.einsum
  if isinstance(layer, nnx.Linear):
    return "dot_general", lax.dot_general
  if isinstance(layer, nnx.LinearGeneral):
    return "dot_general", None
  return None


def _definition_rank(model, path) -> list[int]:
  """Where each step of `path` was assigned in its parent (attribute order; an index in
  a sequence), as a sort key: nnx's graph order sorts attribute names instead."""
  rank, node = [], model
  for name in path:
    keys = (list(node) if isinstance(node, dict) else range(len(node))
            if isinstance(node, (list, tuple)) else list(vars(node)))
    keys = [str(k) for k in keys]
    rank.append(keys.index(str(name)) if str(name) in keys else len(keys))
    node = (node[name] if isinstance(node, (dict, list, tuple))
            else getattr(node, str(name), None))
  return rank


def _gemm_layers(model):
  """(path, layer) of each stock or mxjax GEMM layer, in the order the model assigned them."""
  layers = [(path, node) for path, node in nnx.iter_graph(model)
            if _stock_product(node) is not None or isinstance(node, Linear)]
  layers.sort(key=lambda item: _definition_rank(model, item[0]))
  return [("/".join(str(p) for p in path), node) for path, node in layers]


def gemm_paths(model: nnx.Module, *args, **kwargs) -> list:
  """The paths of a model's products that `quantize` makes MX.

  Args:
    model: an `nnx.Module`.
    args, kwargs: inputs of `model(*args, **kwargs)`: the call is traced once and every
      product it runs is listed in call order as a `ProductPath` (a `str` with
      `.product`). Without inputs: the GEMM layers in the order the model assigned them
      (lost by `nnx.merge` / `nnx.clone`, which sort by name).
  """
  if not args and not kwargs:
    return [path for path, _ in _gemm_layers(model)]
  graphdef, state = nnx.split(model)

  def call(state, args, kwargs):
    copy = quantize(nnx.merge(graphdef, state))
    return copy(*args, **kwargs)

  with context.autocast(recipe=MXFP8BlockScaling()), context.quantized_model_init(
      enabled=False):
    report = products.coverage(call, state, args, kwargs)
  return products.paths_to_quantize(report)


def quantize(model: nnx.Module, rules=None) -> nnx.Module:
  """Makes every product of `model`'s call MX under an enabled autocast, in place: stock
  Linear / LinearGeneral / Einsum layers get an MX product, mxjax `Linear`s their rule's
  recipe (`rule_recipe`), and the model's `__call__` intercepts every other product.

  Args:
    model: an `nnx.Module`.
    rules: `(regex, recipe or None)` pairs matched with `re.search` against each layer's
      graph path (`mxjax.rules`); a layer no rule matches follows the autocast recipe.

  Returns:
    `model` itself; call it as before, plus `mx_rng=key` for recipes with stochastic
    rounding. A bad rule, or a layer with a custom product of its own, raises before
    anything changes.
  """
  if not isinstance(model, nnx.Module):
    raise TypeError(f"mxjax.nnx.quantize needs an nnx.Module, got {type(model).__name__}")
  rules = rules_lib.check(rules, "mxjax.nnx.quantize rules")
  plan = []
  for path, layer in _gemm_layers(model):
    rule = rules_lib.match(rules, *rules_lib.enclosing_paths(path))
    recipe = AUTOCAST if rule is None else rule[1]
    if isinstance(layer, Linear):
      plan.append((layer, "rule_recipe", recipe))
      continue
    attr, stock = _stock_product(layer)
    current = getattr(layer, attr)
    ours = isinstance(current, MXProduct)
    if recipe is None:
      if ours:  # an earlier quantize's product: back to the stock one
        plan.append((layer, attr, stock))
      continue
    if not ours and current is not stock:
      raise ValueError(f"mxjax.nnx.quantize: layer '{path}' ({type(layer).__name__}) already "
                       f"has its own {attr} ({current!r}); give it a rule (pattern, None) to "
                       "leave it, or remove its custom product")
    if attr == "dot_general" and getattr(layer, "dot_general_cls", None) is not None:
      raise ValueError(f"mxjax.nnx.quantize: layer '{path}' has a dot_general_cls, which "
                       "takes precedence over dot_general; give it a rule (pattern, None)")
    plan.append((layer, attr, MXProduct(path, recipe, einsum=attr == "einsum_op")))
  for layer, attr, value in plan:
    setattr(layer, attr, value)
  every_product.intercept_calls(model, rules)
  return model
