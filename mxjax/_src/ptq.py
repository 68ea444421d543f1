"""Post-training quantization: `quantize_params` stores a trained variables tree's kernels
in the recipe's weight format (one copy).

    variables = checkpointer.restore(path, target)          # trained f32 / bf16 params
    mx_variables = mxjax.quantize_params(variables, mxjax.MXFP4BlockScaling())
    with mxjax.autocast(recipe=mxjax.MXFP4BlockScaling()):
      logits = model.apply(mx_variables, tokens)              # the model's code unchanged
"""

from __future__ import annotations

import math
import re
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from mxjax._src import rules as rules_lib
from mxjax._src import context, formats, projection
from mxjax._src.mxarray import MXArray
from mxjax._src.quantize import quantize
from mxjax._src.recipes import Recipe


def _key_name(k) -> str:
  return str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))


def _path_of(keypath) -> str:
  return "/".join(_key_name(k) for k in keypath)


def _is_leaf(x) -> bool:
  return isinstance(x, (MXArray, nnx.Variable))


def _check_block_recipe(recipe, where: str) -> Recipe:
  recipe = context.check_recipe(recipe, where)  # None -> MXFP8
  if recipe.roles() is None:
    raise ValueError(f"{where} stores block-scaled kernels and needs a block-scaled recipe "
                     f"(MX, NVFP4, FP8 blocks; e.g. MXFP8BlockScaling()); got {recipe}")
  return recipe


def quantize_kernel(w, recipe: Recipe, contract_ndim: int = 1, where: str = "kernel"):
  """A kernel `[*contracted (contract_ndim dims), *features]` as one MXArray along axis 0:
  of `w`'s shape, or in 2-D form `[prod(contracted), prod(features)]` where it contracts
  several dims or 2-D tiles meet several feature dims (as mxjax's DenseGeneral stores it)."""
  shape = tuple(jnp.shape(w))
  dtype = jnp.dtype(getattr(w, "dtype", jnp.float32))
  if len(shape) < 2:
    raise ValueError(f"quantize_params: the kernel at '{where}' has shape {shape}; a kernel "
                     f"to quantize must be 2-D or more ([*contracted, *features]): leave it "
                     f"out with a rule (r'{re.escape(where)}$', None)")
  if dtype not in formats.HIGH_PRECISION_DTYPES:
    raise TypeError(f"quantize_params: the kernel at '{where}' has dtype {dtype.name}; it "
                    f"needs bfloat16, float16 or float32")
  if not 1 <= contract_ndim < len(shape):
    raise ValueError(f"quantize_params: the kernel at '{where}' of shape {shape} cannot "
                     f"contract {contract_ndim} leading dims (it needs a feature dim)")
  fmt = projection.weight_format(recipe, "quantize_params")
  if contract_ndim > 1 or (fmt.two_d and len(shape) - contract_ndim > 1):
    w = jnp.reshape(w, (math.prod(shape[:contract_ndim]), -1))
  return quantize(w, fmt, axis=0)


def quantize_params(variables, recipe: Recipe | None = None, rules=None, *,
                    contract_ndim: int | Callable[[str], int] = 1):
  """`variables` with the kernels stored in the recipe's weight format, one MXArray each.

  Kernels: every leaf named `kernel`, plus any leaf whose path (`"params/mlp/wi/kernel"`) a
  rule with a recipe matches. Each runs the first matching rule's recipe (None: kept in
  high precision), else `recipe`; it contracts its leading dim(s), as in Flax's layers.

  Args:
    variables: a linen variables dict or its params, or an NNX state (`nnx.state(model)`);
      `jax.eval_shape` of this gives an orbax restore target.
    recipe: the block-scaled recipe of the kernels no rule decides (MX, NVFP4, FP8
      blocks); None: `MXFP8BlockScaling()`.
    rules: `(pattern, recipe or None)` pairs (`mxjax.rules`); each must match a leaf.
    contract_ndim: how many leading dims of each kernel are contracted, or a function of
      its path (several: stored in 2-D form, as mxjax's DenseGeneral keeps it).

  Returns:
    The same tree with each kernel an MXArray (NNX: a frozen `mxjax.nnx.QuantizedKernel`
    in place of the `nnx.Param`); an MXArray already there is kept if it fits its recipe.

  Raises:
    ValueError: naming the path: a kernel below 2-D, a rule matching no leaf, a recipe
      that is not block-scaled, an MXArray another recipe made.
  """
  where = "quantize_params"
  recipe = _check_block_recipe(recipe, where)
  checked = rules_lib.check(rules, f"{where}: rules")
  for pattern, rule_recipe in checked:
    if rule_recipe is not None:
      _check_block_recipe(rule_recipe, f"{where}: the rule {pattern!r}")
  if isinstance(variables, nnx.Module):
    raise TypeError(f"{where} takes a variables tree: pass nnx.state(model) (then "
                    f"nnx.update(model, result)), not the module")
  flat = jax.tree_util.tree_flatten_with_path(variables, is_leaf=_is_leaf)[0]
  paths = [_path_of(keypath) for keypath, _ in flat]
  for pattern, _ in checked:
    if not any(re.search(pattern, p) for p in paths):
      raise ValueError(f"{where}: the rule {pattern!r} matches no leaf of the variables; "
                       f"paths look like {paths[:3]}")

  def convert(keypath, leaf):
    path = _path_of(keypath)
    rule = rules_lib.match(checked, path)
    named = bool(keypath) and _key_name(keypath[-1]) == "kernel"
    if not (named or (rule is not None and rule[1] is not None)):
      return leaf
    kernel_recipe = recipe if rule is None else rule[1]
    value = leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf
    if kernel_recipe is None:
      return leaf
    if isinstance(value, MXArray):
      if value.format != projection.weight_format(kernel_recipe, where):
        raise ValueError(f"{where}: recipe mismatch at '{path}': it holds an MXArray "
                         f"({value.format}), but its recipe is [{kernel_recipe}]")
      return leaf
    n = contract_ndim(path) if callable(contract_ndim) else contract_ndim
    mx = quantize_kernel(value, kernel_recipe, int(n), path)
    if isinstance(leaf, nnx.Variable):
      from mxjax.nnx.modules import QuantizedKernel  # noqa: PLC0415  (nnx builds on this)
      metadata = {k: v for k, v in leaf.get_metadata().items()
                  if k not in ("out_sharding", "sharding_names", "sharding")}
      return QuantizedKernel(mx, **metadata)
    return mx

  return jax.tree_util.tree_map_with_path(convert, variables, is_leaf=_is_leaf)
