"""mxjax: Microscaling (MX) and the other block-scaled formats (NVFP4, FP8 blocks) for JAX.

Quantize kernels on the XLA FFI (CPU, CUDA), one block-scaled product with a custom VJP
(`dot_general`, `einsum`, `ragged_dot`), recipes chosen with `autocast`, functional
recipe state and Flax modules, for every format.
"""

from mxjax._src.formats import (BLOCK_SIZES, BlockFormat, ElementFormat, ScaleFormat, ScaleMode,
                                element_format, fp8_block, mx, nvfp4)
from mxjax._src.mxarray import MXArray
from mxjax._src.quantize import dequantize, fake_quantize, quantize, quantize_2x
from mxjax._src.dot import dot_general, matmul
from mxjax._src.einsum import einsum
from mxjax._src.ragged import ragged_dot
from mxjax._src.recipes import (DelayedScaling, Float8BlockScaling, Float8CurrentScaling, Format,
                                FormatPair, MXBlockScaling, MXFP4BlockScaling, MXFP6BlockScaling,
                                MXFP8BlockScaling, NVFP4BlockScaling, Recipe)
from mxjax._src.roles import Roles
from mxjax._src.context import autocast, get_recipe, quantized_model_init
from mxjax.state import describe
from mxjax._src.memory import memory_report
from mxjax._src.ptq import quantize_params
from mxjax.linen import Dense, DenseGeneral, LayerNormDense, LayerNormMLP
from mxjax._src.backend import backend_info, set_kernels
from mxjax._src.interception import quantized
from mxjax._src.products import Coverage, Product, coverage
from mxjax import linen, nnx, rules, state

__version__ = "0.1.0"

# The public API (the docs' API reference renders these; the submodules `linen`, `nnx`,
# `rules` and `state` have their own `__all__` and pages).
__all__ = [
    # formats and arrays
    "BlockFormat", "mx", "nvfp4", "fp8_block", "ElementFormat", "ScaleFormat", "ScaleMode",
    "BLOCK_SIZES", "element_format", "MXArray",
    # ops
    "quantize", "quantize_2x", "dequantize", "fake_quantize", "dot_general", "matmul",
    "einsum", "ragged_dot",
    # recipes and context
    "Recipe", "Roles", "Format", "FormatPair", "MXFP8BlockScaling", "MXFP6BlockScaling", "MXFP4BlockScaling",
    "MXBlockScaling", "NVFP4BlockScaling", "Float8BlockScaling", "DelayedScaling",
    "Float8CurrentScaling", "autocast", "get_recipe", "quantized_model_init",
    "quantize_params",
    # every product of any model: the function transformation and what it did
    "quantized", "coverage", "Coverage", "Product",
    # linen modules (also in mxjax.linen)
    "Dense", "DenseGeneral", "LayerNormDense", "LayerNormMLP",
    # reports and platform
    "describe", "memory_report", "backend_info", "set_kernels",
]
