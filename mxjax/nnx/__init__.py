"""Flax NNX: mxjax's own `Linear`, and `quantize(model, rules)` for stock NNX models."""

from mxjax.nnx.modules import Linear, QuantizedKernel, RecipeStateVar
from mxjax.nnx.quantize_model import MXProduct, gemm_paths, quantize

__all__ = ["Linear", "QuantizedKernel", "RecipeStateVar", "quantize", "gemm_paths", "MXProduct"]
