"""Layer-path rules: which recipe each GEMM of a model runs, and named presets (tiers).

A rule set is a sequence of `(pattern, recipe_or_None)` pairs. A layer's path is the
names from the model's root joined by "/" (linen: `decoder/block_0/mlp/Dense_1`; NNX:
`layers/0/attn/q_einsum`). Under an enabled `mxjax.autocast`, the first pattern that
`re.search`-es the path decides: a recipe runs that recipe, None keeps the layer in high
precision; a layer no rule matches runs the autocast recipe. Outside an enabled autocast
every layer is in high precision.

    rules = [(r"lm_head", None), (r"mlp", mxjax.MXFP4BlockScaling())]

Presets, `preset(name, gemm_paths)`:

- "all": every GEMM runs the autocast recipe (no rules).
- "no_ends": high precision for the embedding lookups (`embed` in the path), the LM head
  (a path part named `lm_head`, `head`, `logits`, `unembed` or `output`), and the first
  and last GEMM of `gemm_paths` (the model's GEMM layer paths in call order, e.g.
  `mxjax.linen.gemm_paths`); the autocast recipe everywhere else.
- "mlp_only": only GEMMs with a path part containing `mlp`, `ffn` or `feed_forward` /
  `feedforward` run the autocast recipe; everything else stays in high precision.
- "no_attention": high precision for the products between two activations (attention's
  QK^T and PV), as TransformerEngine keeps them; needs `gemm_paths` from
  `mxjax.linen.gemm_paths` / `mxjax.nnx.gemm_paths(model, *inputs)`, which know which
  products those are.

A product's path is its module path plus an op name counted per module in call order
(`layer_0/attn/einsum_1`, `mlp/dot_general_0`); a stock or mxjax layer's one
product is named by its layer path (`mlp/Dense_0`). A rule also names every product
inside the modules it names: it is matched against the product's path and each of its
enclosing module paths (`block_0/mlp/Dense_0`, `block_0/mlp`, `block_0`), so
`(r"^block_0/mlp$", None)` keeps all of that MLP's products in high precision; a pattern
that starts with a negative lookahead ("every path but ...": `^(?!block_0/mlp)`, the
"mlp_only" preset's) is matched against the product's own path only.
"""

from __future__ import annotations

import re
from typing import Sequence

from mxjax._src.recipes import Recipe

Rules = tuple[tuple[str, "Recipe | None"], ...]

EMBED = r"(?i)embed"
LM_HEAD = r"(?i)(^|/)(lm_?head|head|logits|unembed|output)(/|$)"
_MLP_PART = r"(^|/)[^/]*(mlp|ffn|feed_?forward)[^/]*(/|$)"
#: A path with no MLP part (what "mlp_only" keeps in high precision).
NOT_MLP = rf"(?i)^(?!.*{_MLP_PART})"

PRESETS = ("all", "no_ends", "mlp_only", "no_attention")
#: The presets' own patterns: a model may have no path they match, and that is no mistake.
PRESET_PATTERNS = (EMBED, LM_HEAD, NOT_MLP)
#: A pattern that starts with a negative lookahead ("every path but ...", as NOT_MLP) is
#: matched against the path itself only: the modules above the path it excludes match it.
_EXCLUDING = re.compile(r"(\(\?[a-zA-Z]+\))?\^?\(\?!")

__all__ = ["Rules", "PRESETS", "EMBED", "LM_HEAD", "NOT_MLP", "preset", "check", "match",
           "recipe_for", "enclosing_paths"]


def check(rules, where: str = "rules") -> Rules:
  """Validates a rule sequence and returns it as a hashable tuple of pairs.

  Args:
    rules: a sequence of `(pattern, recipe or None)` pairs, or None (no rules).
    where: how error messages name the rules (e.g. "mxjax.nnx.quantize rules").

  Returns:
    The rules as a tuple of `(pattern, recipe or None)` pairs (() for None).

  Raises:
    TypeError: a rule that is not a (pattern, recipe) pair, a pattern that is not a str,
      or a recipe that is neither None nor an mxjax recipe (the message names the rule).
    ValueError: a pattern that is not a valid regular expression.
  """
  if rules is None:
    return ()
  if isinstance(rules, (str, bytes)) or not isinstance(rules, Sequence):
    raise TypeError(f"{where} must be a sequence of (pattern, recipe or None) pairs, got "
                    f"{type(rules).__name__}")
  checked = []
  for i, rule in enumerate(rules):
    if not isinstance(rule, (tuple, list)) or len(rule) != 2:
      raise TypeError(f"{where}[{i}] must be a (pattern, recipe or None) pair, got {rule!r}")
    pattern, recipe = rule
    if not isinstance(pattern, str):
      raise TypeError(f"{where}[{i}]: the pattern must be a str, got {type(pattern).__name__}")
    try:
      re.compile(pattern)
    except re.error as err:
      raise ValueError(f"{where}[{i}]: {pattern!r} is not a valid regular expression: "
                       f"{err}") from None
    if recipe is not None and not isinstance(recipe, Recipe):
      raise TypeError(f"{where}[{i}] ({pattern!r}): the recipe must be an mxjax recipe (e.g. "
                      f"mxjax.MXFP8BlockScaling()) or None, got {type(recipe).__name__}")
    checked.append((pattern, recipe))
  return tuple(checked)


def match(rules: Rules, path: str, *also: str):
  """The first rule whose pattern `re.search`-es `path` or one of `also`, or None.

  Args:
    rules: checked rules (`check`): `(pattern, recipe or None)` pairs.
    path: a layer or product path, e.g. "block_0/mlp/Dense_1", "block_0/attn/einsum_1".
    also: more paths the rule may name instead: a product's enclosing module paths, so
      a rule naming a layer covers the products inside it.

  Returns:
    The first matching `(pattern, recipe or None)` pair, or None. A pattern that starts
    with a negative lookahead (`^(?!...)`, e.g. `NOT_MLP`) is matched against `path` alone.
  """
  for rule in rules:
    if any(re.search(rule[0], p) for p in ((path,) if _EXCLUDING.match(rule[0])
                                           else (path, *also))):
      return rule
  return None


def enclosing_paths(path: str) -> list[str]:
  """A path and its enclosing module paths, longest first (what rules match):
  `a/b/c` -> [`a/b/c`, `a/b`, `a`]."""
  parts = path.split("/")
  return ["/".join(parts[:n]) for n in range(len(parts), 0, -1)]


def recipe_for(rules: Rules, path: str, default: Recipe | None) -> Recipe | None:
  """The recipe of the layer at `path`: the first rule matching it or an enclosing module
  path (`enclosing_paths`), else `default`.

  Args:
    rules: checked rules (`check`).
    path: the layer's path.
    default: what a path no rule matches runs (the autocast recipe, or None).

  Returns:
    A recipe, or None for high precision.
  """
  rule = match(rules, *enclosing_paths(path))
  return default if rule is None else rule[1]


def preset(name: str, gemm_paths: Sequence[str] = ()) -> Rules:
  """The rules of a named preset (see the module docstring).

  Args:
    name: "all", "no_ends", "mlp_only" or "no_attention".
    gemm_paths: the model's product paths in call order (`linen.gemm_paths`,
      `nnx.gemm_paths`): "no_ends" keeps the first and the last in high precision,
      "no_attention" those between activations; ignored by the other presets.

  Returns:
    The rules, a tuple of `(pattern, None)` pairs (() for "all").

  Raises:
    ValueError: an unknown preset name, or "no_attention" without the paths
      `gemm_paths` returns.
  """
  if name == "all":
    return ()
  if name == "no_ends":
    paths = list(gemm_paths)
    ends = dict.fromkeys(paths[:1] + paths[-1:])
    return ((EMBED, None), (LM_HEAD, None), *((f"^{re.escape(p)}$", None) for p in ends))
  if name == "mlp_only":
    return ((NOT_MLP, None),)
  if name == "no_attention":
    if not all(hasattr(p, "activations") for p in gemm_paths) or not gemm_paths:
      raise ValueError('preset("no_attention", gemm_paths) needs the paths that '
                       "mxjax.linen.gemm_paths(model, *inputs) or mxjax.nnx.gemm_paths(model, "
                       "*inputs) return: they know which products are between activations")
    return tuple((f"^{re.escape(p)}$", None) for p in gemm_paths if p.activations)
  raise ValueError(f"unknown rules preset {name!r}; choose from {', '.join(PRESETS)}")
