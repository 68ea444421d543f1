"""MX for linen models, unchanged: `intercept(rules)` and `gemm_paths(...)`.

    with mxjax.autocast(recipe=mxjax.MXFP8BlockScaling()), mxjax.linen.intercept(rules):
      logits = model.apply(params, tokens)

Inside `intercept`, every product the model computes runs through mxjax under the recipe
of its path (`mxjax.rules`); the model's code, params and (stateless recipes) variables
stay the stock model's, and `init` runs as it is. A Flax method interceptor runs the
outermost method call as a lifted transform through the interception core; stock Dense /
DenseGeneral / Einsum layers take `mxjax.linen.hooks` products (which can keep
DelayedScaling state in `state_collection`).
"""

from __future__ import annotations

import contextlib
import functools
import threading

import flax.linen as nn
from flax.core import lift
import jax
import jax.numpy as jnp

from mxjax._src import state as state_lib
from mxjax._src import context, interception, products
from mxjax._src.einsum import parse_subscripts
from mxjax.linen import hooks
from mxjax.linen.modules import layer_path
from mxjax._src.recipes import MXFP8BlockScaling

_DENSE = (nn.Dense, nn.DenseGeneral)
#: The function behind `nn.Einsum.__call__` (what `ctx.orig_method` binds).
_EINSUM_CALL = getattr(nn.Einsum.__call__, "__wrapped__", nn.Einsum.__call__)


def _runs_einsum_call(ctx) -> bool:
  """Whether the intercepted method is `nn.Einsum`'s own `__call__`, not an override."""
  fun = getattr(ctx.orig_method, "func", ctx.orig_method)  # a partial over the module
  return getattr(fun, "__func__", fun) is _EINSUM_CALL


@contextlib.contextmanager
def intercept(rules=None, *, state_collection: str = state_lib.STATE_COLLECTION):
  """Runs every product of a linen model's `apply` through mxjax.

  Args:
    rules: `(regex, recipe or None)` pairs on product paths (`mxjax.rules`); None: every
      product runs the autocast recipe. A rule that matches no product warns.
    state_collection: the collection of the stock layers' DelayedScaling states
      (`flax.linen.fp8_ops.OVERWRITE_WITH_GRADIENT`: `TrainState` applies the overwrite).
  """
  interceptor = functools.partial(_interceptor, state_collection=state_collection)
  with context.layer_rules(rules), nn.intercept_methods(interceptor):
    yield


def gemm_paths(module: nn.Module, *args, **kwargs) -> list[products.ProductPath]:
  """The paths of the products `intercept` makes MX in a linen model, in call order.

  Args:
    module: an unbound linen module; args, kwargs: inputs for `module.init` (only their
      shapes and dtypes are used: nothing is computed).

  Returns:
    One `ProductPath` per product (a `str` with `.product`), leaving out what no recipe
    quantizes; the same inside any mxjax context and outside.
  """
  def init():
    return module.init(jax.random.key(0), *args, **kwargs)

  with context.autocast(recipe=MXFP8BlockScaling()), context.quantized_model_init(
      enabled=False), intercept(), _set("at_init"):
    report = products.coverage(init)
  return products.paths_to_quantize(report)


def _takes_a_product(module: nn.Module) -> bool:
  """Whether `module` is a stock Dense / DenseGeneral with no product of its own."""
  return (isinstance(module, _DENSE) and module.dot_general is None
          and module.dot_general_cls is None)


def _with_product(module: nn.Module, dot_general_cls, next_fun, args, kwargs):
  """`next_fun(*args, **kwargs)` with `module.dot_general_cls` set for the call."""
  object.__setattr__(module, "dot_general_cls", dot_general_cls)
  try:
    return next_fun(*args, **kwargs)
  finally:
    object.__setattr__(module, "dot_general_cls", None)


#: Per thread: `inside` (under the outermost call) and `at_init` (intercept `init` too).
_OUTERMOST = threading.local()


@contextlib.contextmanager
def _set(flag: str):
  before = getattr(_OUTERMOST, flag, False)
  setattr(_OUTERMOST, flag, True)
  try:
    yield
  finally:
    setattr(_OUTERMOST, flag, before)


def _interceptor(next_fun, args, kwargs, ctx, *, state_collection: str):
  module = ctx.module
  if (not getattr(_OUTERMOST, "inside", False) and ctx.method_name != "setup"
      and callable(getattr(type(module), ctx.method_name, None))  # not Flax's own lambdas
      and context.get_recipe() is not None and module.scope is not None):
    if module.is_initializing() and not getattr(_OUTERMOST, "at_init", False):
      with _set("inside"):  # init runs as it is: the stock params, bit for bit
        return _interceptor(next_fun, args, kwargs, ctx, state_collection=state_collection)
    return _every_product(module, ctx, args, kwargs)
  if ctx.method_name != "__call__":
    return next_fun(*args, **kwargs)
  if _takes_a_product(module):
    return _with_product(
        module, functools.partial(hooks.DotGeneral, state_collection=state_collection),
        next_fun, args, kwargs)
  if (isinstance(module, nn.Einsum) and _runs_einsum_call(ctx)
      and context.recipe_for(layer_path(module)) is not None):
    return _einsum_layer(module, state_collection, *args, **kwargs)
  return next_fun(*args, **kwargs)


def _einsum_layer(module: nn.Einsum, state_collection: str, inputs,
                  einsum_str: str | None = None):
  """`nn.Einsum.__call__` (the same params, promotion and bias) with `hooks.Einsum`."""
  einsum_str = nn.merge_param("einsum_str", module.einsum_str, einsum_str).replace(" ", "")
  if "->" not in einsum_str or einsum_str.count(",") != 1:
    raise ValueError(f"nn.Einsum '{layer_path(module)}' needs an explicit two-operand "
                     f"equation with '->', got {einsum_str!r}")
  kernel = module.param("kernel", module.kernel_init, module.shape, module.param_dtype)
  bias = None
  if module.use_bias:
    _, kernel_ix, out_ix = parse_subscripts(einsum_str, inputs.ndim, len(module.shape))
    # per output index: its kernel dim's size (a feature, carried by the bias) or None
    features = [module.shape[kernel_ix.index(c)] if c in kernel_ix else None for c in out_ix]
    bias = module.param("bias", module.bias_init, [n for n in features if n is not None],
                        module.param_dtype)
  inputs, kernel, bias = module.promote_dtype(inputs, kernel, bias, dtype=module.dtype)
  y = hooks.Einsum(state_collection=state_collection)(
      einsum_str, inputs, kernel, precision=module.precision,
      preferred_element_type=module.preferred_element_type)
  if bias is not None:
    y += jnp.reshape(bias, [1 if n is None else n for n in features])
  return y


def _every_product(module: nn.Module, ctx, args, kwargs):
  """The model's outermost method call through the interception core, as a lifted
  transform (variables and rngs in, mutated collections out)."""
  recipe, rules = context.get_recipe(), context.get_layer_rules() or ()
  root = type(module).__name__ if module.name is None else module.name
  where = f"the linen model {type(module).__name__}"

  def transform(fn, scopes, *a, **k):
    def inner(scope_fn, repack_fn, variable_groups, rng_groups, *a, **k):
      def pure(variable_groups, rng_groups, a, k):
        scope = scope_fn(variable_groups, rng_groups)
        return fn(scope, *a, **k), repack_fn(scope)

      probe = scope_fn(variable_groups, rng_groups)  # stochastic rounding's key, if given
      probe = probe[0] if isinstance(probe, (list, tuple)) else probe
      rng = probe.make_rng("mx") if recipe.needs_rng() and probe.has_rng("mx") else None

      with _set("inside"):
        return interception.run(pure, (variable_groups, rng_groups, a, k), {}, recipe=recipe,
                                rules=rules, where=where, strip=root, weight_args=2,
                                dequantize=_params_dequantized, rng=rng)

    return lift.pack(inner, (True,), (True,), (True,), name="mx", enable_kwargs=True)(
        scopes, *a, **k)

  method = getattr(ctx.orig_method, "func", ctx.orig_method)  # a partial over the module
  method = getattr(method, "__func__", method)  # the function itself (any method, a lambda)
  return nn.transforms.lift_direct_transform(transform, (method,), module, *args, **kwargs)


def _params_dequantized(inputs):
  """The MXArrays of `params` dequantized (`mx_kernels` stays quantized for its layers)."""
  (variable_groups, *rest), kwargs = inputs

  def collections(x):  # groups (per filter) of scopes' {collection: variables}
    if isinstance(x, (tuple, list)):
      return type(x)(collections(item) for item in x)
    return {name: interception.dequantized(tree) if name == "params" else tree
            for name, tree in x.items()}

  return (collections(variable_groups), *rest), kwargs
