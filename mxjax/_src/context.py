"""Which recipe the GEMMs use: `autocast(...)`, `layer_rules(...)` and
`quantized_model_init(...)`.

All are context managers over `jax.make_user_context` values (recipes or None), so
`jax.jit`'s cache is keyed on them: a jitted function called under another recipe is
traced again.
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax

from mxjax._src import rules as rules_lib
from mxjax._src.recipes import MXFP8BlockScaling, Recipe

#: The recipe of the innermost enabled `autocast`, or None (high precision).
_AUTOCAST = jax.make_user_context(default_value=None)


@dataclasses.dataclass(frozen=True)
class QuantizedInit:
  """How `quantized_model_init` stores kernels: `recipe`'s weight format, one copy along the
  contraction or, with `columnwise`, the pair (along the contraction, along the features)."""

  recipe: Recipe
  columnwise: bool = False


_QUANTIZED_INIT = jax.make_user_context(default_value=None)

#: The linen collection of the kernels made under `quantized_model_init`: outside `params`,
#: so gradients and optimizers never see them (NNX: `mxjax.nnx.QuantizedKernel`).
QUANTIZED_KERNELS = "mx_kernels"


def _check_enabled(enabled, what: str) -> bool:
  """`enabled` as a bool; a recipe given in its place (positionally) is a TypeError."""
  if isinstance(enabled, Recipe) or (isinstance(enabled, type) and issubclass(enabled, Recipe)):
    raise TypeError(f"{what}'s first argument is `enabled`; pass the recipe by keyword: "
                    f"{what}(recipe={enabled!r})")
  return bool(enabled)


def check_recipe(recipe, what: str) -> Recipe:
  if recipe is None:
    return MXFP8BlockScaling()
  if not isinstance(recipe, Recipe):
    raise TypeError(f"{what} needs an mxjax recipe (e.g. MXFP8BlockScaling()), got "
                    f"{type(recipe).__name__}")
  if not (recipe.fp8() or recipe.block_scaling()):  # kinds with a GEMM path
    raise TypeError(f"{what} needs an MX or per-tensor FP8 recipe (e.g. "
                    f"MXFP8BlockScaling()), got {type(recipe).__name__}")
  return recipe


@contextlib.contextmanager
def autocast(enabled: bool = True, recipe: Recipe | None = None):
  """Runs the mxjax modules (and functions that ask `get_recipe()`) under `recipe`.

  Args:
    enabled: False computes in high precision, also inside an enabled autocast.
    recipe: the recipe; None means `MXFP8BlockScaling()`.
  """
  value = check_recipe(recipe, "autocast") if _check_enabled(enabled, "autocast") else None
  with _AUTOCAST(value):
    yield


def get_recipe() -> Recipe | None:
  """The recipe of the innermost enabled `autocast`; None (high precision) outside one."""
  return _AUTOCAST.value


#: The layer-path rules of the innermost `layer_rules` (a `rules.Rules` tuple), or None.
_LAYER_RULES = jax.make_user_context(default_value=None)


@contextlib.contextmanager
def layer_rules(rules):
  """GEMM layers inside follow `rules` (`mxjax.rules`) by their path; a layer no rule
  matches runs the autocast recipe. `mxjax.linen.intercept` enters this for you."""
  with _LAYER_RULES(rules_lib.check(rules)):
    yield


def get_layer_rules() -> rules_lib.Rules | None:
  """The rules of the innermost `layer_rules`, or None outside one."""
  return _LAYER_RULES.value


def recipe_for(path: str) -> Recipe | None:
  """The recipe of the GEMM layer at `path`: the first matching rule's under `layer_rules`,
  else the autocast recipe; None outside an enabled autocast."""
  recipe = get_recipe()
  if recipe is None:
    return None
  return rules_lib.recipe_for(_LAYER_RULES.value or (), path, recipe)


@contextlib.contextmanager
def quantized_model_init(enabled: bool = True, recipe: Recipe | None = None, *,
                         for_training: bool = False, columnwise: bool | None = None):
  """Modules initialized inside store their kernels quantized (MX recipes only).

  Each kernel is quantized once from its initial value. By default (inference) it keeps one
  copy, blocks along the contraction (MXFP8 1.03 B/param, MXFP6 0.78, MXFP4 0.53);
  `for_training=True` also keeps the dgrad's copy along the output features
  (`quantize_2x`), doubling the bytes, unless `columnwise=False` (the dgrad then reuses the
  stored copy's values).

  Such weights are frozen: linen modules store them in the collection "mx_kernels"
  (`apply` needs it next to "params"), NNX modules in `mxjax.nnx.QuantizedKernel`
  variables, so gradients and optimizers leave them alone (E8M0 scales have no zero).
  They run only under a matching recipe (or with autocast off, dequantized);
  `mxjax.memory_report` says per kernel which copies are kept.

  Args:
    enabled: False initializes kernels in high precision as usual.
    recipe: a block-scaled recipe (its weight format is stored: 2-D tiles serve both
      products in one copy); None means `MXFP8BlockScaling()`.
    for_training: keep the dgrad's copy too (the default of `columnwise`).
    columnwise: whether to keep the copy along the output features; None: `for_training`.
  """
  value = None
  if _check_enabled(enabled, "quantized_model_init"):
    recipe = check_recipe(recipe, "quantized_model_init")
    if recipe.roles() is None:
      raise ValueError(f"quantized_model_init stores block-scaled kernels (the recipe's weight "
                       f"format) and needs a block-scaled recipe (MX, NVFP4, FP8 blocks); got "
                       f"{recipe}")
    value = QuantizedInit(recipe, bool(for_training if columnwise is None else columnwise))
  with _QUANTIZED_INIT(value):
    yield


def get_quantized_init() -> QuantizedInit | None:
  """The active `quantized_model_init` settings, or None."""
  return _QUANTIZED_INIT.value
