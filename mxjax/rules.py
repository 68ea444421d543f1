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

from mxjax._src.rules import (  # noqa: F401  (the public names)
    Rules, PRESETS, EMBED, LM_HEAD, NOT_MLP, preset, check, match, recipe_for, enclosing_paths)

__all__ = ["Rules", "PRESETS", "EMBED", "LM_HEAD", "NOT_MLP", "preset", "check", "match", "recipe_for",
           "enclosing_paths"]
