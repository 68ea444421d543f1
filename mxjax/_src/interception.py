"""Every product of a traced program, as an MX product: `quantized(fn, rules)`.

The interception core behind `mxjax.quantized`, `mxjax.linen.intercept` and
`mxjax.nnx.quantize`: the function is traced to a jaxpr and evaluated again with each
floating-point `dot_general` and `ragged_dot_general` replaced by mxjax's product under the
recipe of its path (`mxjax.rules`: module path plus `einsum_N` / `dot_general_N` /
`ragged_dot_N`). It recurses into `jit`, `scan`, `while`, `cond`, `checkpoint` and
`shard_map`; `custom_vjp` / `custom_jvp` functions and mxjax's own products run as they
are. A product stays in high precision (`mxjax.coverage` says why) for a rule's None, a
dtype other than bf16 / f16 / f32, a contraction shorter than one block, or a stateful
recipe. MXArray leaves of the arguments are dequantized where the function reads them.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import re
import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jex_core
from jax.extend import source_info_util

from mxjax._src import rules as rules_lib
from mxjax._src import projection, context, formats, products, ragged
from mxjax._src import state as state_lib
from mxjax._src.mxarray import MXArray

def quantized(fn, rules=None, *, name: str | None = None):
  """`fn` with every product it computes run through mxjax (a function transformation).

  For example::

      loss_mx = mxjax.quantized(loss, rules=[(r"attn/einsum", None)])
      with mxjax.autocast(recipe=mxjax.MXFP8BlockScaling()):
        grads = jax.grad(loss_mx)(params, batch)

  Args:
    fn: a function of arrays (pytrees of them; other leaves are taken as static).
    rules: `(regex, recipe or None)` pairs on product paths (`mxjax.rules`); None: the
      rules of an enclosing `mxjax._src.context.layer_rules` (what `linen.intercept` enters),
      else every product runs the autocast recipe.
    name: what warnings call the function (default its `__name__`).

  Returns:
    A function with `fn`'s signature plus a keyword `mx_rng` (the key of recipes with
    stochastic rounding, a new one per step). Under an enabled `mxjax.autocast` it runs
    each product as the MX product of its rule; outside one it is `fn` itself. Warns, once
    per trace, when it quantizes no product and for each rule that matches no path.
  """
  checked = None if rules is None else rules_lib.check(rules, "mxjax.quantized rules")
  label = name or getattr(fn, "__name__", type(fn).__name__)

  @functools.wraps(fn)
  def wrapper(*args, mx_rng=None, **kwargs):
    recipe = context.get_recipe()
    if recipe is None:
      return fn(*args, **kwargs)
    rules = checked if checked is not None else (context.get_layer_rules() or ())
    return run(fn, args, kwargs, recipe=recipe, rules=rules, where=label, rng=mx_rng)

  return wrapper


def run(fn, args, kwargs, *, recipe, rules, where: str, strip: str = "",
        weight_args: int = 1, dequantize=None, rng=None):
  """`fn(*args, **kwargs)` with its products intercepted (see `quantized`).

  Args:
    strip: a leading name-stack part that is not a module path (a linen root's name).
    dequantize: `(args, kwargs) -> (args, kwargs)` with the MXArrays the function's code
      reads as arrays dequantized (default: every MXArray leaf).
    rng: a key for recipes with stochastic rounding, folded with each product's number.
    weight_args: how many leading arguments are weights (a product of two values computed
      from the others is between activations).
  """
  leaves, tree = jax.tree.flatten((args, kwargs))
  n_weights = len(jax.tree.leaves(args[:weight_args]))
  dynamic = [i for i, leaf in enumerate(leaves) if _is_array(leaf)]
  out_tree = []

  def flat_fn(*values):
    full = list(leaves)
    for i, value in zip(dynamic, values):
      full[i] = value
    a, k = (dequantize or dequantized)(jax.tree.unflatten(tree, full))
    out, treedef = jax.tree.flatten(fn(*a, **k))
    out_tree.append(treedef)
    return out

  values = [leaves[i] for i in dynamic]
  closed = jax.make_jaxpr(flat_fn)(*values)
  walk = _Walk(recipe, rules, strip, rng, where)
  outs = walk.eval(closed.jaxpr, closed.consts, values, "", [i < n_weights for i in dynamic])
  walk.report(where)
  return jax.tree.unflatten(out_tree[0], outs)


def _is_array(x) -> bool:
  return isinstance(x, (jax.Array, jnp.ndarray)) or (
      hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, type))


def dequantized(tree):
  """The tree with each MXArray (or MXArray pair) leaf as its high-precision value."""
  is_mx = lambda x: isinstance(x, MXArray) or (  # noqa: E731
      isinstance(x, tuple) and len(x) == 2 and all(isinstance(a, MXArray) for a in x))

  def value(x):
    if not is_mx(x):
      return x
    first = x[0] if isinstance(x, tuple) else x
    return first.dequantize(first.dtype)

  if is_mx(tree):
    return value(tree)
  return jax.tree.map(value, tree, is_leaf=is_mx)


class _Walk:
  """One interpretation of a traced program: the products it meets, in order."""

  def __init__(self, recipe, rules, strip: str, rng=None, where: str = ""):
    self.recipe, self.rules, self.strip, self.rng, self.where = recipe, rules, strip, rng, where
    self.counts: collections.Counter = collections.Counter()
    self.paths: list[str] = []
    self.kept: collections.Counter = collections.Counter()  # high-precision reasons
    self.made = 0  # MX products, made here or met as made (mxjax's layers, hooks)
    self.met: set[int] = set()  # the records of the products met as made

  def eval(self, jaxpr, consts, args, stack: str, weights) -> list:
    """Evaluates `jaxpr` on `args`; `weights[i]`: whether args[i] comes from weights alone."""
    env, env_w = {}, {}

    def read(v):
      return v.val if isinstance(v, jex_core.Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts):
      env[v], env_w[v] = x, True
    for v, x, w in zip(jaxpr.invars, args, weights):
      env[v], env_w[v] = x, w
    for eqn in jaxpr.eqns:
      names = "/".join(s for s in (stack, products.name_stack_of(eqn)) if s)
      invals = [read(v) for v in eqn.invars]
      in_w = [isinstance(v, jex_core.Literal) or env_w[v] for v in eqn.invars]
      name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
      with source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack):
        outs = self._eqn(eqn, invals, in_w, names)
      if not eqn.primitive.multiple_results:
        outs = [outs]
      for v, x in zip(eqn.outvars, outs):
        env[v], env_w[v] = x, all(in_w)
    return [read(v) for v in jaxpr.outvars]

  def _eqn(self, eqn, invals, in_w, names: str):
    name = eqn.primitive.name
    record = products.record_of(names)
    if record is not None:  # mxjax's own product (a layer, a hook): as it is
      number, product = record
      if number not in self.met:
        self.met.add(number)
        self.paths.append(product.path)
        self.made += product.mx
      return self._bind(eqn, invals)
    activations = not any(in_w[:2])
    if name == "dot_general":
      return self._dot(eqn, invals, names, activations)
    if name == "ragged_dot_general":
      return self._ragged(eqn, invals, names, activations)
    params = eqn.params
    inner = products.products_in(eqn)
    if not inner:  # no product inside: as it is
      return self._bind(eqn, invals)
    sub = functools.partial(self._sub, names=names)
    if name in ("jit", "pjit", "closed_call", "core_call"):
      inner = params.get("jaxpr", params.get("call_jaxpr"))
      return sub(inner, in_w)(*invals)
    if name == "scan":
      return self._scan(eqn, invals, sub(params["jaxpr"], in_w))
    if name == "while":
      n = params["cond_nconsts"]
      body = sub(params["body_jaxpr"], in_w[n:])
      cond = sub(params["cond_jaxpr"], in_w[:n] + in_w[n + params["body_nconsts"]:])
      return self._while(eqn, invals, cond, body)
    if name == "cond":
      index, *ops = invals
      return lax.switch(index, [sub(b, in_w[1:]) for b in params["branches"]], *ops)
    if name in ("checkpoint", "remat", "remat2"):
      fn = jax.checkpoint(sub(params["jaxpr"], in_w), prevent_cse=params["prevent_cse"],
                          policy=params["policy"])
      return fn(*invals)
    if name == "shard_map":
      return self._shard_map(eqn, invals, sub(params["jaxpr"], in_w))
    if name.startswith("custom_"):
      return self._custom(eqn, invals, names, inner)
    return self._bind(eqn, invals)

  @staticmethod
  def _bind(eqn, invals):
    """The equation as it is (as `jax.core.eval_jaxpr` binds it)."""
    bound = eqn.primitive.get_bind_params(eqn.params)
    subfuns, params = bound if isinstance(bound, tuple) else ((), bound)  # older jax: a pair
    manager = getattr(getattr(eqn, "ctx", None), "manager", None) or contextlib.nullcontext()
    with manager:
      return eqn.primitive.bind(*subfuns, *invals, **params)

  def _sub(self, jaxpr, weights, names: str):
    """A sub-jaxpr (closed or open) as a function of its inputs, interpreted."""
    closed = jaxpr if hasattr(jaxpr, "consts") else None
    open_jaxpr, consts = (closed.jaxpr, closed.consts) if closed else (jaxpr, ())
    return lambda *xs: list(self.eval(open_jaxpr, consts, xs, names, weights))

  def _scan(self, eqn, invals, body):
    p = eqn.params
    consts, init, xs = (invals[:p["num_consts"]],
                        invals[p["num_consts"]:p["num_consts"] + p["num_carry"]],
                        invals[p["num_consts"] + p["num_carry"]:])

    def step(carry, x):
      outs = body(*consts, *carry, *x)
      return list(outs[:len(carry)]), list(outs[len(carry):])

    carry, ys = lax.scan(step, list(init), list(xs), length=p["length"], reverse=p["reverse"],
                         unroll=p["unroll"])
    return [*carry, *ys]

  @staticmethod
  def _while(eqn, invals, cond, body):
    p = eqn.params
    cond_consts = invals[:p["cond_nconsts"]]
    body_consts = invals[p["cond_nconsts"]:p["cond_nconsts"] + p["body_nconsts"]]
    init = invals[p["cond_nconsts"] + p["body_nconsts"]:]
    return list(lax.while_loop(lambda c: cond(*cond_consts, *c)[0],
                               lambda c: body(*body_consts, *c), list(init)))

  @staticmethod
  def _shard_map(eqn, invals, body):
    p = eqn.params
    fn = jax.shard_map(body, mesh=p["mesh"],
                       in_specs=tuple(p["in_specs"]), out_specs=list(p["out_specs"]),
                       axis_names=set(p["newly_manual_axes"]), check_vma=p["check_vma"])
    return fn(*invals)

  def _module(self, names: str) -> str:
    """The module path in a name stack (without the root's own scopes)."""
    parts = products.plain_path(names).split("/") if names else []
    while parts and self.strip and (parts[0] == self.strip
                                    or parts[0].startswith(self.strip + ".")):
      parts = parts[1:]  # the root's own scopes (a linen root: `Model`, `Model.method`)
    return "/".join(p for p in parts if p)

  def _name(self, names: str, op: str | None = None) -> tuple[str, str]:
    """(path, op) of a product: module path / op name with a per-module count."""
    module = self._module(names)
    op = op or products.dot_op(names)
    number = self.counts[(module, op)]
    self.counts[(module, op)] += 1
    return (f"{module}/{op}_{number}" if module else f"{op}_{number}"), op

  def _plan(self, path: str, lhs, rhs, contraction: int, out_dtype):
    """(recipe, None) for a quantized product, or (None, reason) for a high-precision one."""
    dtypes = {jnp.dtype(lhs.dtype), jnp.dtype(rhs.dtype), jnp.dtype(out_dtype)}
    if not dtypes <= set(formats.HIGH_PRECISION_DTYPES):
      return None, f"operand dtype {'/'.join(sorted(d.name for d in dtypes))}"
    rule = rules_lib.match(self.rules, *rules_lib.enclosing_paths(path))
    recipe = self.recipe if rule is None else rule[1]
    if recipe is None:
      return None, f"rule {rule[0]!r}"
    if recipe.stateful():
      return None, (f"{type(recipe).__name__} keeps per-layer state, which only mxjax's "
                    "layers and stock Dense / Einsum layers hold")
    roles = recipe.roles()
    if roles is not None and contraction < roles.x.block_size:
      return None, f"contraction {contraction} shorter than one block ({roles.x.block_size})"
    return recipe, None

  def _dot(self, eqn, invals, names, activations: bool):
    lhs, rhs = invals
    dims = eqn.params["dimension_numbers"]
    out_dtype = eqn.outvars[0].aval.dtype
    path, op = self._name(names)
    contraction = math.prod(jnp.shape(lhs)[d] for d in dims[0][0])
    recipe, reason = self._plan(path, lhs, rhs, contraction, out_dtype)
    self._note(path, recipe, reason)
    if recipe is None:
      flops = products.dot_flops(jnp.shape(lhs), jnp.shape(rhs), dims)
      with products.marked(op, jnp.shape(lhs), jnp.shape(rhs), flops, None, reason, path,
                           activations):
        return self._bind(eqn, invals)
    with products.label(path, op, recipe, activations):
      return projection.project(lhs, rhs, recipe, state_lib.init(recipe), dtype=out_dtype,
                                where=f"product '{path}'", dimension_numbers=dims,
                                out_sharding=eqn.params.get("out_sharding"),
                                rng=self._key(recipe))[0]

  def _key(self, recipe):
    """The SR key of one product: the call's key folded with its number, or None."""
    if not recipe.needs_rng() or self.rng is None:
      return None
    return jax.random.fold_in(self.rng, len(self.paths))

  def _ragged(self, eqn, invals, names, activations: bool):
    lhs, rhs, group_sizes = invals[:3]
    path, op = self._name(names, "ragged_dot")
    p = eqn.params
    form = ragged.standard_form(p["ragged_dot_dimension_numbers"], jnp.ndim(lhs), jnp.ndim(rhs))
    recipe, reason = self._plan(path, lhs, rhs, jnp.shape(lhs)[-1], eqn.outvars[0].aval.dtype)
    if recipe is not None and not form:
      recipe, reason = None, "a ragged_dot_general other than [M, K] x [G, K, N]"
    if recipe is not None and recipe.roles() is None:
      recipe, reason = None, f"{type(recipe).__name__}: per-tensor FP8 has no grouped GEMM"
    if recipe is not None and (why := ragged.unsupported(recipe.roles())) is not None:
      recipe, reason = None, why
    if recipe is not None and p.get("group_offset") is not None:
      recipe, reason = None, "a ragged_dot_general with a group_offset"
    self._note(path, recipe, reason)
    flops = products.ragged_flops(jnp.shape(lhs), jnp.shape(rhs))
    if recipe is None:
      with products.marked(op, jnp.shape(lhs), jnp.shape(rhs), flops, None, reason, path,
                           activations):
        return self._bind(eqn, invals)
    with products.label(path, op, recipe, activations):
      return ragged.ragged_dot(lhs, rhs, group_sizes, recipe=recipe, rng=self._key(recipe),
                               name=path, preferred_element_type=eqn.outvars[0].aval.dtype)

  def _custom(self, eqn, invals, names, count: int):
    """A custom_vjp / custom_jvp function with `count` products: as it is, reported kept."""
    kind = eqn.primitive.name.removesuffix("_call")
    reason = f"inside a {kind} function (its own derivative rule)"
    module = self._module(names)
    for _ in range(count):
      self._note(module, None, reason)
    with products.marked(products.SCOPE, (), (), 0, None, reason, module):
      return self._bind(eqn, invals)

  def _note(self, path, recipe, reason):
    self.paths.append(path)
    if recipe is None:
      self.kept[reason.split(" '")[0] if reason.startswith("rule") else reason] += 1
    else:
      self.made += 1

  def report(self, where: str) -> None:
    """Warns when nothing was quantized, and for each rule that matched no path."""
    if not self.made:
      why = ("it computes no dot_general / einsum / matmul / ragged_dot" if not self.paths
             else "; ".join(f"{n} kept in high precision: {r}" for r, n in self.kept.items()))
      warnings.warn(f"mxjax: {where} ran under autocast({products.describe(self.recipe)}) "
                    "but quantized no "
                    f"product: {why}. Check mxjax.coverage(...).", UserWarning, stacklevel=3)
    named = [name for path in self.paths for name in rules_lib.enclosing_paths(path)]
    for pattern, _ in self.rules:
      if pattern in rules_lib.PRESET_PATTERNS:
        continue
      if not any(re.search(pattern, name) for name in named):
        some = ", ".join(repr(p) for p in self.paths[:6]) or "none"
        warnings.warn(f"mxjax: in {where}, the rule {pattern!r} matches no product path; "
                      f"the paths are e.g. {some}", UserWarning, stacklevel=3)
