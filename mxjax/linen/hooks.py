"""MX products for Flax's own hooks: `DotGeneral` (`dot_general_cls=`) and `Einsum`
(`qk_attn_weights_einsum_cls=` / `attn_weights_value_einsum_cls=`).

    nn.Dense(256, dot_general_cls=mxjax.linen.DotGeneral)
    nn.MultiHeadDotProductAttention(8, qkv_dot_general_cls=mxjax.linen.DotGeneral,
                                    out_dot_general_cls=mxjax.linen.DotGeneral,
                                    qk_attn_weights_einsum_cls=mxjax.linen.Einsum,
                                    attn_weights_value_einsum_cls=mxjax.linen.Einsum)

A hook (the calling layer's child) follows its `recipe`, else the owning layer's (layer
rules, then autocast); with none it makes exactly Flax's call. A DelayedScaling state lives
in the hook's scope, in `state_collection`; stateless recipes add no variables.
"""

from __future__ import annotations

import contextlib

import jax.numpy as jnp
import flax.linen as nn
from jax import lax

from mxjax._src import context, products, rules as rules_lib, state as state_lib
from mxjax._src.einsum import einsum_as_dot_general, einsum_flops
from mxjax.linen.modules import _STATE_NAME, project_with_state
from mxjax._src.recipes import Recipe


class _Hook(nn.Module):
  """What both hooks share: the recipe of the owning layer, and the state."""

  recipe: Recipe | None = None
  state_collection: str = state_lib.STATE_COLLECTION

  def _owner(self) -> str:
    return "/".join(str(p) for p in self.scope.path[:-1])

  def _recipe(self) -> Recipe | None:
    return self.recipe if self.recipe is not None else context.recipe_for(self._owner())

  def _kept(self, lhs_shape, rhs_shape, flops: int):
    """Flax's own call, marked as kept in high precision by a rule under autocast."""
    if context.get_recipe() is None:
      return contextlib.nullcontext()
    rule = rules_lib.match(context.get_layer_rules() or (),
                           *rules_lib.enclosing_paths(self._owner()))
    why = f"rule {rule[0]!r}" if rule else f"the rule for its layer '{self._owner()}'"
    return products.marked(type(self).__name__.lower().replace("dotgeneral", "dot_general"),
                           lhs_shape, rhs_shape, flops, None, why, self._owner())

  def _plain(self, recipe) -> bool:
    """Whether to make Flax's own call: no recipe and no state to keep."""
    return recipe is None and not self.has_variable(self.state_collection, _STATE_NAME)

  def _product(self, lhs, rhs, dimension_numbers, recipe, precision, preferred_element_type,
               out_sharding=None):
    dtype = jnp.dtype(preferred_element_type or jnp.result_type(lhs, rhs))
    return project_with_state(
        self, lhs, rhs, recipe, collection=self.state_collection, dtype=dtype,
        where=f"{type(self).__name__} of '{self._owner()}'",
        dimension_numbers=dimension_numbers, precision=precision, store_stateless=False,
        out_sharding=out_sharding, path=self._owner())


class DotGeneral(_Hook):
  """`lax.dot_general(lhs, rhs, dimension_numbers)` under the owning layer's recipe.

  Attributes:
    recipe: None: the rules / autocast recipe of the owning layer (see module docstring).
    state_collection: where a DelayedScaling state is kept ("mx_state").
  """

  @nn.compact
  def __call__(self, lhs, rhs, dimension_numbers, precision=None,
               preferred_element_type=None, out_sharding=None):
    """lhs, rhs: arrays of one float dtype -> the `lax.dot_general` result."""
    recipe = self._recipe()
    if self._plain(recipe):
      kwargs = {} if out_sharding is None else dict(out_sharding=out_sharding)
      with self._kept(lhs.shape, rhs.shape,
                      products.dot_flops(lhs.shape, rhs.shape, dimension_numbers)):
        return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type, **kwargs)
    return self._product(lhs, rhs, dimension_numbers, recipe, precision,
                         preferred_element_type, out_sharding)


class Einsum(_Hook):
  """`jnp.einsum(subscripts, a, b)` under the owning layer's recipe (see `mxjax.einsum`).

  Attributes:
    recipe, state_collection: as in `DotGeneral`.
  """

  @nn.compact
  def __call__(self, subscripts: str, a, b, precision=None, preferred_element_type=None,
               _dot_general=None, out_sharding=None):
    """subscripts: a two-operand equation; a, b: float arrays -> the einsum result."""
    recipe = self._recipe()
    if self._plain(recipe):
      kwargs = {} if out_sharding is None else dict(out_sharding=out_sharding)
      if _dot_general is not None:
        kwargs["_dot_general"] = _dot_general
      with self._kept(a.shape, b.shape, einsum_flops(subscripts, a.shape, b.shape)):
        return jnp.einsum(subscripts, a, b, precision=precision,
                          preferred_element_type=preferred_element_type, **kwargs)

    def dot(a, b, dims, out_sharding=None):
      return self._product(a, b, dims, recipe, precision, preferred_element_type, out_sharding)

    return einsum_as_dot_general(subscripts, a, b, dot, out_sharding)
