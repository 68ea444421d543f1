"""Flax linen: mxjax's own modules, Flax-hook classes and whole-model interception.

- `Dense`, `DenseGeneral`, `LayerNormDense`, `LayerNormMLP`: modules whose GEMMs follow
  the recipe (new code).
- `DotGeneral`, `Einsum`: for Flax's `dot_general_cls` and attention `*_einsum_cls` hooks.
- `intercept(rules)`: stock linen models, unchanged; `gemm_paths` lists their GEMM layers.
"""

from mxjax.linen.modules import (ACTIVATIONS, Dense, DenseGeneral, LayerNormDense,
                                 LayerNormMLP, layer_path)
from mxjax.linen.hooks import DotGeneral, Einsum
from mxjax.linen.intercept import gemm_paths, intercept
