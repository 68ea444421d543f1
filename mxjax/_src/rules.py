"""Layer-path rules and presets (the rules: `mxjax.rules`)."""

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
#: A pattern starting with a negative lookahead (as NOT_MLP) is matched to the path only.
_EXCLUDING = re.compile(r"(\(\?[a-zA-Z]+\))?\^?\(\?!")

__all__ = ["Rules", "PRESETS", "EMBED", "LM_HEAD", "NOT_MLP", "preset", "check", "match",
           "recipe_for", "enclosing_paths"]


def check(rules, where: str = "rules") -> Rules:
  """Validates a rule sequence and returns it as a hashable tuple of pairs.

  Args:
    rules: a sequence of `(pattern, recipe or None)` pairs, or None (no rules).
    where: how error messages name the rules (e.g. "mxjax.nnx.quantize rules").

  Raises:
    TypeError: a rule that is not a (str pattern, recipe or None) pair.
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
    also: more paths the rule may name instead (a product's enclosing module paths);
      a pattern starting with a negative lookahead (`NOT_MLP`) is matched to `path` alone.
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
  """The recipe (None: high precision) of the layer at `path`: the first rule matching it
  or an enclosing module path (`enclosing_paths`), else `default`."""
  rule = match(rules, *enclosing_paths(path))
  return default if rule is None else rule[1]


def preset(name: str, gemm_paths: Sequence[str] = ()) -> Rules:
  """The rules of a named preset (see `mxjax.rules`).

  Args:
    name: "all", "no_ends", "mlp_only" or "no_attention".
    gemm_paths: the model's product paths in call order (`linen.gemm_paths`,
      `nnx.gemm_paths`): "no_ends" keeps the first and the last in high precision,
      "no_attention" those between activations; ignored by the other presets.

  Raises:
    ValueError: an unknown name, or "no_attention" without `gemm_paths`' paths.
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
