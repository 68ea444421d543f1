"""What a program quantized: a record per product, and `coverage(fn, *args)`.

Every product mxjax computes (or interception keeps in high precision) is traced under a
named scope `mx#N` pointing to a `Product` record, so the traced program is its own report:
`coverage` walks its jaxpr, taking each marked product's record and counting every unmarked
`dot_general` / `ragged_dot_general` as one nothing intercepted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import re
import threading
import warnings

import jax
from jax.extend import core as jex_core
from jax.extend import source_info_util

#: The op of a record that names a function's products (a custom_vjp left as it is).
SCOPE = "scope"
#: Why a product is in high precision when nothing intercepted it.
NOT_INTERCEPTED = ("not intercepted: no mxjax.quantized / linen.intercept / nnx.quantize "
                   "around it under an enabled autocast")
#: Why a product is in high precision when `coverage` ran outside every enabled autocast.
NO_AUTOCAST = "no recipe: no enabled mxjax.autocast around the coverage call"


@dataclasses.dataclass(frozen=True)
class Product:
  """One product of a traced program.

  Attributes:
    path: `module path / op name` (e.g. `layer_0/attn/einsum_1`), a layer's product by its
      layer path; "" where nothing named it.
    op: "einsum" (`jnp.einsum`), "dot_general" (`@`, `jnp.dot`, ...) or "ragged_dot".
    lhs_shape, rhs_shape, flops: operand shapes; 2 * output size * contraction, per call.
    recipe: what it runs (e.g. "MXFP8BlockScaling(...)"), or None in high precision.
    reason: why it is in high precision (None when it is not).
    calls: how often the traced program runs it (a scan's length; 1 elsewhere).
    activations: whether neither operand comes from the weights alone (attention's QK^T).
  """

  path: str
  op: str
  lhs_shape: tuple[int, ...]
  rhs_shape: tuple[int, ...]
  flops: int
  recipe: str | None
  reason: str | None = None
  calls: int = 1
  activations: bool = False

  @property
  def mx(self) -> bool:
    return self.recipe is not None


def dot_flops(lhs_shape, rhs_shape, dimension_numbers) -> int:
  """2 x batch x lhs free x rhs free x contraction sizes of a `dot_general`."""
  (lc, rc), (lb, rb) = dimension_numbers
  free_l = [d for i, d in enumerate(lhs_shape) if i not in (*lc, *lb)]
  free_r = [d for i, d in enumerate(rhs_shape) if i not in (*rc, *rb)]
  return 2 * math.prod(lhs_shape[i] for i in (*lc, *lb)) * math.prod(free_l) * math.prod(free_r)


_RECORDS: dict[int, Product] = {}
_MAX_RECORDS = 1 << 16
_IDS = itertools.count()
_LOCAL = threading.local()
_MARK = re.compile(r"mx#(\d+)")


def _labels() -> list:
  if not hasattr(_LOCAL, "labels"):
    _LOCAL.labels = []
  return _LOCAL.labels


def describe(recipe) -> str:
  """A recipe in a few words: `MXFP8BlockScaling(e4m3/e5m2, block 32)`."""
  formats_ = "/".join(f for f in (getattr(recipe, "fwd_format", None),
                                  getattr(recipe, "bwd_format", None)) if f)
  block = f", block {recipe.block_size}" if getattr(recipe, "block_size", None) else ""
  return f"{type(recipe).__name__}({formats_}{block})"


@contextlib.contextmanager
def label(path: str, op: str, recipe, activations: bool = False):
  """The mxjax product made inside is recorded as `path` / `op` running `recipe`."""
  _labels().append((path, op, None if recipe is None else describe(recipe), activations))
  try:
    yield
  finally:
    _labels().pop()


@contextlib.contextmanager
def marked(op: str, lhs_shape, rhs_shape, flops: int, recipe: str | None,
           reason: str | None = None, path: str | None = None, activations: bool = False):
  """A named scope `mx#N` for one product; the innermost `label` names it."""
  if _labels():
    path, op, labelled, activations = _labels()[-1]
    recipe = labelled if recipe is not None and labelled is not None else recipe
  if path is None:  # e.g. an mxjax.nnx.Linear: its module path, where its scope names it
    path = plain_path(str(source_info_util.current_name_stack()))
  number = next(_IDS)
  if len(_RECORDS) >= _MAX_RECORDS:
    _RECORDS.pop(next(iter(_RECORDS)))
  _RECORDS[number] = Product(path or "", op, tuple(lhs_shape), tuple(rhs_shape), int(flops),
                             recipe, reason, activations=activations)
  with jax.named_scope(f"mx#{number}"):
    yield


def record_of(name_stack: str) -> tuple[int, Product] | None:
  """(number, record) of the innermost product scope in a name stack, or None."""
  numbers = _MARK.findall(name_stack)
  if not numbers or int(numbers[-1]) not in _RECORDS:
    return None
  return int(numbers[-1]), _RECORDS[int(numbers[-1])]


class ProductPath(str):
  """A product's path (`gemm_paths`): a `str` carrying its `Product` record (`.product`)."""

  product: Product

  def __new__(cls, product: Product):
    path = super().__new__(cls, product.path)
    path.product = product
    return path

  @property
  def activations(self) -> bool:
    return self.product.activations


def paths_to_quantize(report: "Coverage") -> list[ProductPath]:
  """The MX products of a report as `ProductPath`s, in trace order, each path once."""
  seen, paths = set(), []
  for p in report.products:
    if p.mx and p.path not in seen:
      seen.add(p.path)
      paths.append(ProductPath(p))
  return paths


@dataclasses.dataclass(frozen=True)
class Coverage:
  """Every product of a traced program, in trace order (see `coverage`).

  Attributes:
    products: one `Product` per product, in trace order.
    autocast: the enabled `mxjax.autocast`'s recipe, described; None outside one.
  """

  products: tuple[Product, ...]
  autocast: str | None = None

  @property
  def total_flops(self) -> int:
    return sum(p.flops * p.calls for p in self.products)

  @property
  def mx_flops(self) -> int:
    return sum(p.flops * p.calls for p in self.products if p.mx)

  @property
  def mx_share(self) -> float:
    """MX FLOPs / all dot FLOPs (0.0 for a program without products)."""
    return self.mx_flops / self.total_flops if self.total_flops else 0.0

  def table(self) -> str:
    """A plain-text table: path, op, shapes, MFLOP, recipe or 'high precision: reason'."""
    rows = [("path", "op", "lhs x rhs", "MFLOP", "recipe")]
    head = (f"under autocast({self.autocast})" if self.autocast is not None else
            "NO ACTIVE AUTOCAST: traced outside mxjax.autocast(...), so nothing picked a "
            "recipe; call coverage inside the autocast the model runs under")
    for p in self.products:
      shapes = f"{list(p.lhs_shape)} x {list(p.rhs_shape)}"
      what = p.recipe if p.mx else f"high precision: {p.reason}"
      rows.append((p.path or "?", p.op, shapes, f"{p.flops * p.calls / 1e6:.3g}", what))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [head] + ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4]
                      for r in rows]
    lines.append(f"MX share of dot FLOPs: {100 * self.mx_share:.1f}% "
                 f"({len([p for p in self.products if p.mx])} of {len(self.products)} products)")
    return "\n".join(lines)

  __str__ = table


def coverage(fn, *args, **kwargs) -> Coverage:
  """Every product `fn(*args, **kwargs)` computes, under the current context.

  Traces `fn` once (nothing runs) and reports each product's path, shapes, FLOPs and
  recipe, or the reason it is in high precision. Call it inside the same `autocast` /
  `intercept` as the function::

      with mxjax.autocast(recipe=mxjax.MXFP8BlockScaling()), mxjax.linen.intercept():
        print(mxjax.coverage(model.apply, variables, tokens))

  Outside an enabled `autocast` the table and a `UserWarning` say so.

  Args:
    fn: any function of arrays (jitted or not).
    *args, **kwargs: its arguments (arrays or `jax.ShapeDtypeStruct` values).

  Returns:
    A `Coverage`: `.products` (in trace order), `.mx_share`, `.table()`.
  """
  import mxjax  # noqa: PLC0415 - the public context (products sits below it)
  recipe = mxjax.get_recipe()
  closed = jax.make_jaxpr(fn)(*args, **kwargs)
  products: list[Product] = []
  _walk(closed.jaxpr, "", 1, None, products, set())
  if recipe is None:
    products = [dataclasses.replace(p, reason=NO_AUTOCAST) if p.reason == NOT_INTERCEPTED
                else p for p in products]
    if any(not p.mx for p in products):
      warnings.warn("mxjax.coverage ran outside an enabled mxjax.autocast: no recipe is "
                    "active, so intercepted products and mxjax's modules stay in high "
                    "precision. Call it inside the autocast (and intercept) the model runs "
                    "under.", UserWarning, stacklevel=2)
  return Coverage(tuple(products), None if recipe is None else describe(recipe))


def name_stack_of(eqn) -> str:
  """An equation's name stack as "a/b/c" ("" where this jax keeps none)."""
  return str(getattr(getattr(eqn, "source_info", None), "name_stack", "") or "")


def _walk(jaxpr, stack: str, calls: int, inside: str | None, out: list, seen: set,
          prefix: str = "") -> None:
  for eqn in jaxpr.eqns:
    names = "/".join(s for s in (stack, name_stack_of(eqn)) if s)
    numbers = _MARK.findall(names)
    record = _RECORDS.get(int(numbers[-1])) if numbers else None
    if record is not None:
      if int(numbers[-1]) not in seen:
        seen.add(int(numbers[-1]))
        if record.op == SCOPE:  # products of a function left as it is: named inside it
          for sub in jex_core.jaxprs_in_params(eqn.params):
            _walk(sub, "", calls, record.reason, out, seen, record.path)
        else:
          out.append(dataclasses.replace(record, calls=calls))
      continue
    name = eqn.primitive.name
    if name in ("dot_general", "ragged_dot_general"):
      lhs, rhs = (v.aval.shape for v in eqn.invars[:2])
      if name == "dot_general":
        flops, op = dot_flops(lhs, rhs, eqn.params["dimension_numbers"]), dot_op(names)
      else:
        flops, op = ragged_flops(lhs, rhs), "ragged_dot"
      path = "/".join(p for p in (prefix, plain_path(names)) if p)
      out.append(Product(path, op, tuple(lhs), tuple(rhs), flops, None,
                         inside or NOT_INTERCEPTED, calls))
      continue
    times = calls * (eqn.params["length"] if name == "scan" else 1)
    why = inside
    if name.startswith("custom_"):
      why = f"inside a {name.removesuffix('_call')} function (its own derivative rule)"
    for sub in jex_core.jaxprs_in_params(eqn.params):
      _walk(sub, names, times, why, out, seen, prefix)


def products_in(eqn) -> int:
  """How many products an equation's sub-jaxprs compute (as traced)."""
  out: list[Product] = []
  for sub in jex_core.jaxprs_in_params(eqn.params):
    _walk(sub, "", 1, None, out, set())
  return len(out)


def dot_op(names: str) -> str:
  """A dot_general's op name: "einsum" under an einsum equation's scope."""
  return "einsum" if any("->" in part for part in names.split("/")) else "dot_general"


def ragged_flops(lhs_shape, rhs_shape) -> int:
  """FLOPs of `[M, K] x [G, K, N]`: each row meets one group."""
  return 2 * math.prod(lhs_shape) * rhs_shape[-1]


def plain_path(names: str) -> str:
  """A name stack without transform wrappers (`jvp(...)`) and einsum equation scopes."""
  names = re.sub(r"\w+\(", "", names).replace(")", "")
  return "/".join(p for p in names.split("/") if p and "->" not in p and not _MARK.match(p))
