"""Flax linen: mxjax's own modules, Flax-hook classes and whole-model interception.

- `Dense`, `DenseGeneral`, `LayerNormDense`, `LayerNormMLP`: modules whose GEMMs follow
  the recipe (new code).
- `DotGeneral`, `Einsum`: for Flax's `dot_general_cls` and attention `*_einsum_cls` hooks.
- `intercept(rules)`: stock linen models, unchanged; `gemm_paths` lists their GEMM layers.
- `QUANTIZED_KERNELS`: the collection ("mx_kernels") of kernels made under
  `mxjax.quantized_model_init` (frozen: not in "params").
"""

from mxjax.linen.modules import (ACTIVATIONS, Dense, DenseGeneral, LayerNormDense,
                                 LayerNormMLP, layer_path)
from mxjax.linen.hooks import DotGeneral, Einsum
from mxjax._src.context import QUANTIZED_KERNELS
from mxjax.linen.intercept import gemm_paths, intercept

__all__ = ["Dense", "DenseGeneral", "LayerNormDense", "LayerNormMLP", "DotGeneral", "Einsum",
           "intercept", "gemm_paths", "QUANTIZED_KERNELS", "ACTIVATIONS", "layer_path"]
