"""Generation from the sweep's language model with a KV cache, under `jax.jit`.

`CachedLM` is `model.LanguageModel` with a KV cache per block (collection "cache"), taking
the same params (or `quantize_params`' MX ones); `generate` prefills the prompt, then
decodes one token per step in a `lax.fori_loop`.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from mxjax import linen as mxl
from mxjax.sweep.model import _INIT, ModelConfig

CACHE = "cache"


class CachedBlock(nn.Module):
  """`model.Block` on `x` [B, T, D] at positions `index .. index + T - 1`, its keys and
  values written into the cache [B, max_len, H, Dh] and attending to all cached ones."""

  config: ModelConfig
  dtype: Any = jnp.bfloat16

  @nn.compact
  def __call__(self, x, index):
    c = self.config
    head_dim = c.d_model // c.heads
    b, t = x.shape[:2]
    qkv = mxl.LayerNormDense((3, c.heads, head_dim), dtype=self.dtype, kernel_init=_INIT,
                             name="qkv")(x)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    shape = (b, c.max_len, c.heads, head_dim)
    keys = self.variable(CACHE, "key", jnp.zeros, shape, self.dtype)
    values = self.variable(CACHE, "value", jnp.zeros, shape, self.dtype)
    keys.value = lax.dynamic_update_slice(keys.value, k.astype(self.dtype), (0, index, 0, 0))
    values.value = lax.dynamic_update_slice(values.value, v.astype(self.dtype),
                                            (0, index, 0, 0))
    scores = (jnp.einsum("bqhd,bkhd->bhqk", q, keys.value)
              / jnp.sqrt(head_dim).astype(self.dtype))
    visible = jnp.arange(c.max_len)[None, :] <= (index + jnp.arange(t))[:, None]
    scores = jnp.where(visible, scores.astype(jnp.float32), -1e9)
    probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
    att = jnp.einsum("bhqk,bkhd->bqhd", probs, values.value)
    x = x + mxl.DenseGeneral(c.d_model, axis=(-2, -1), dtype=self.dtype, kernel_init=_INIT,
                             name="out")(att)
    return x + mxl.LayerNormMLP(c.mlp_ratio * c.d_model, activations=("gelu",),
                                dtype=self.dtype, kernel_init=_INIT, name="mlp")(x)


class CachedLM(nn.Module):
  """`model.LanguageModel` with a KV cache: tokens int[B, T] at positions `index ..` ->
  logits f32[B, T, vocab]; apply with `mutable=["cache"]`."""

  config: ModelConfig
  dtype: Any = jnp.bfloat16

  @nn.compact
  def __call__(self, tokens, index):
    c = self.config
    x = nn.Embed(c.vocab, c.d_model, embedding_init=_INIT, name="embed")(tokens)
    pos = self.param("pos", _INIT, (c.max_len, c.d_model))
    x = (x + lax.dynamic_slice_in_dim(pos, index, tokens.shape[1]).astype(x.dtype))
    x = x.astype(self.dtype)
    for i in range(c.layers):
      x = CachedBlock(c, self.dtype, name=f"block_{i}")(x, index)
    logits = mxl.LayerNormDense(c.vocab, dtype=self.dtype, kernel_init=_INIT,
                                name="lm_head")(x)
    return logits.astype(jnp.float32)


@functools.partial(jax.jit, static_argnames=("config", "dtype", "steps", "temperature"))
def generate(params, prompt, key, *, config: ModelConfig, steps: int,
             temperature: float = 0.0, dtype=jnp.bfloat16):
  """`steps` tokens after `prompt` int32[B, P] (P + steps <= max_len): int32[B, steps].

  Greedy when `temperature` is 0, else sampled with `key`; under the caller's autocast.
  """
  b, p = prompt.shape
  if p + steps > config.max_len:
    raise ValueError(f"prompt {p} + {steps} steps exceeds max_len {config.max_len}")
  model = CachedLM(config, dtype)

  def pick(logits, key):
    if temperature == 0.0:
      return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, logits / temperature).astype(jnp.int32)

  logits, state = model.apply({"params": params}, prompt, 0, mutable=[CACHE])
  keys = jax.random.split(key, steps)
  out = jnp.zeros((b, steps), jnp.int32).at[:, 0].set(pick(logits[:, -1], keys[0]))

  def step(i, carry):
    out, cache = carry
    last = lax.dynamic_slice_in_dim(out, i - 1, 1, axis=1)  # [B, 1]
    logits, state = model.apply({"params": params, CACHE: cache}, last, p + i - 1,
                                mutable=[CACHE])
    return out.at[:, i].set(pick(logits[:, -1], keys[i])), state[CACHE]

  out, _ = lax.fori_loop(1, steps, step, (out, state[CACHE]))
  return out
