"""A small byte-level decoder-only transformer whose every linear layer is an mxjax module.

Pre-norm blocks: `LayerNormDense` (qkv) -> causal attention -> `DenseGeneral` (out);
`LayerNormMLP` (gelu); a `LayerNormDense` LM head. Every GEMM with weights follows the
autocast recipe; attention scores and the embedding lookup stay in `dtype`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from mxjax import linen as mxl

VOCAB = 256


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape of the model: residual width (a multiple of `heads`), blocks, heads, longest
  sequence (learned positions), MLP width / d_model, byte vocabulary."""

  d_model: int = 128
  layers: int = 2
  heads: int = 4
  max_len: int = 128
  mlp_ratio: int = 4
  vocab: int = VOCAB

  def __post_init__(self):
    if self.d_model % self.heads:
      raise ValueError(f"d_model {self.d_model} is not a multiple of heads {self.heads}")


_INIT = nn.initializers.normal(0.02)


class Block(nn.Module):
  """One pre-norm transformer block: x [B, T, D] -> [B, T, D]."""

  config: ModelConfig
  dtype: Any = jnp.bfloat16

  @nn.compact
  def __call__(self, x):
    c = self.config
    head_dim = c.d_model // c.heads
    qkv = mxl.LayerNormDense((3, c.heads, head_dim), dtype=self.dtype, kernel_init=_INIT,
                             name="qkv")(x)  # [B, T, 3, H, Dh]
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(head_dim).astype(self.dtype)
    t = x.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    scores = jnp.where(causal, scores.astype(jnp.float32), -1e9)
    probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
    att = jnp.einsum("bhqk,bkhd->bqhd", probs, v)  # [B, T, H, Dh]
    x = x + mxl.DenseGeneral(c.d_model, axis=(-2, -1), dtype=self.dtype, kernel_init=_INIT,
                             name="out")(att)
    return x + mxl.LayerNormMLP(c.mlp_ratio * c.d_model, activations=("gelu",),
                                dtype=self.dtype, kernel_init=_INIT, name="mlp")(x)


class LanguageModel(nn.Module):
  """Byte-level LM: int tokens [B, T] -> logits f32[B, T, vocab].

  Attributes:
    config: the model shape.
    dtype: computation dtype (params are float32).
  """

  config: ModelConfig
  dtype: Any = jnp.bfloat16

  @nn.compact
  def __call__(self, tokens):
    c = self.config
    if tokens.shape[1] > c.max_len:
      raise ValueError(f"sequence of {tokens.shape[1]} tokens exceeds max_len {c.max_len}")
    x = nn.Embed(c.vocab, c.d_model, embedding_init=_INIT, name="embed")(tokens)
    pos = self.param("pos", _INIT, (c.max_len, c.d_model))
    x = (x + pos[:tokens.shape[1]]).astype(self.dtype)
    for i in range(c.layers):
      x = Block(c, self.dtype, name=f"block_{i}")(x)
    logits = mxl.LayerNormDense(c.vocab, dtype=self.dtype, kernel_init=_INIT,
                                name="lm_head")(x)
    return logits.astype(jnp.float32)


def contraction_ndim(path: tuple[str, ...]) -> int:
  """How many leading dims of the kernel at `path` are contracted (2 for attention's out)."""
  return 2 if "out" in path else 1


def layer_path(path: tuple[str, ...]) -> str:
  """The GEMM layer path of a kernel's param path: (..., 'dense', 'kernel') -> '.../dense'."""
  return "/".join(path[:-1])


def map_kernels(params, fn: Callable, where: Callable[[str], bool] | None = None):
  """`params` with each GEMM kernel `w` replaced by `fn(w as [K, N])` in w's shape.

  Args:
    params: the model's params.
    fn: `[K, N] -> [K, N]` (K: the contracted dims flattened, see `contraction_ndim`).
    where: `layer_path -> bool` picks the kernels to map (default: all).
  """
  targets = kernels(params)

  def visit(keypath, leaf):
    path = tuple(getattr(k, "key", str(k)) for k in keypath)
    if path not in targets or (where is not None and not where(layer_path(path))):
      return leaf
    k = math.prod(leaf.shape[:contraction_ndim(path)])
    return fn(leaf.reshape(k, -1)).reshape(leaf.shape)

  return jax.tree_util.tree_map_with_path(visit, params)


def kernels(params) -> dict[tuple[str, ...], jax.Array]:
  """Every `kernel` param of the model, by path (a tuple of names)."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  out = {}
  for keypath, leaf in flat:
    path = tuple(getattr(k, "key", str(k)) for k in keypath)
    if path[-1] == "kernel":
      out[path] = leaf
  return out


def count_params(params) -> tuple[int, int]:
  """(all params, params in GEMM kernels)."""
  total = sum(x.size for x in jax.tree.leaves(params))
  return total, sum(k.size for k in kernels(params).values())
