"""Models written the way JAX model libraries write them (Gemma, MaxText): their own
modules computing products with `jnp.einsum`, `lax.dot_general`, `@` and `jnp.dot`, a tied
embedding head `x @ table.T`, layers stacked with `nn.scan` / `nnx.scan`, and a
mixture-of-experts block on `jax.lax.ragged_dot`. No stock Flax GEMM layer anywhere."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

VOCAB, DIM, HEADS, HEAD_DIM, HIDDEN, LAYERS, EXPERTS = 64, 64, 2, 32, 128, 2, 4
INIT = nn.initializers.normal(0.05)


def route(logits, top_k: int = 2):
  """Top-k routing: (rows sorted by expert, their token ids, their gates, group sizes).
  The last expert is never chosen, so its group is empty."""
  logits = logits.at[..., -1].set(-1e9)
  gates, experts = lax.top_k(jax.nn.softmax(logits), top_k)      # [T, k]
  experts, gates = experts.reshape(-1), gates.reshape(-1)
  order = jnp.argsort(experts)
  token = order // top_k
  sizes = jnp.bincount(experts, length=logits.shape[-1]).astype(jnp.int32)
  return token, gates[order], sizes


# -- linen -------------------------------------------------------------------------------


class Einsum(nn.Module):
  """Gemma's own einsum layer: a param and `jnp.einsum`."""
  shape: tuple[int, ...]

  @nn.compact
  def __call__(self, eqn: str, x):
    return jnp.einsum(eqn, x, self.param("w", INIT, self.shape))


class Embedder(nn.Module):
  @nn.compact
  def __call__(self, tokens):
    return self.param("table", INIT, (VOCAB, DIM))[tokens]

  def decode(self, x):  # the tied LM head
    return x @ self.variables["params"]["table"].T


class Block(nn.Module):
  moe: bool = False

  @nn.compact
  def __call__(self, x, _=None):
    b, t, _d = x.shape
    q = Einsum((DIM, HEADS, HEAD_DIM), name="q")("btd,dnh->btnh", x)
    k = Einsum((DIM, HEADS, HEAD_DIM), name="k")("btd,dnh->btnh", x)
    v = Einsum((DIM, HEADS, HEAD_DIM), name="v")("btd,dnh->btnh", x)
    logits = jnp.einsum("btnh,bsnh->bnts", q, k) / HEAD_DIM ** 0.5
    mask = jnp.tril(jnp.ones((t, t), bool))
    probs = jax.nn.softmax(jnp.where(mask, logits, -1e9), axis=-1)
    attn = jnp.einsum("bnts,bsnh->btnh", probs, v)
    w_o = self.param("w_o", INIT, (HEADS, HEAD_DIM, DIM))  # an own DenseGeneral
    x = x + lax.dot_general(attn, w_o, (((2, 3), (0, 1)), ((), ())))
    h = nn.LayerNorm(use_bias=False, use_scale=False)(x)
    if self.moe:
      flat = h.reshape(b * t, DIM)
      token, gates, sizes = route(flat @ self.param("router", INIT, (DIM, EXPERTS)))
      up = lax.ragged_dot(flat[token], self.param("wi", INIT, (EXPERTS, DIM, HIDDEN)), sizes)
      down = lax.ragged_dot(jax.nn.gelu(up), self.param("wo", INIT, (EXPERTS, HIDDEN, DIM)),
                            sizes)
      y = jnp.zeros_like(flat).at[token].add(down * gates[:, None]).reshape(b, t, DIM)
    else:
      up = jax.nn.gelu(h @ self.param("wi", INIT, (DIM, HIDDEN)))
      y = jnp.dot(up, self.param("wo", INIT, (HIDDEN, DIM)))
    return x + y, None


class LinenLM(nn.Module):
  moe: bool = False

  @nn.compact
  def __call__(self, tokens):
    embed = Embedder(name="embedder")
    x = embed(tokens)
    layers = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True},
                     length=LAYERS)(moe=self.moe, name="layers")
    x, _ = layers(x, None)
    return embed.decode(nn.LayerNorm()(x))


# -- NNX ---------------------------------------------------------------------------------


class NnxBlock(nnx.Module):
  def __init__(self, rngs: nnx.Rngs, moe: bool = False):
    def param(*shape):
      return nnx.Param(INIT(rngs.params(), shape))
    self.q, self.k, self.v = (param(DIM, HEADS, HEAD_DIM) for _ in range(3))
    self.w_o = param(HEADS, HEAD_DIM, DIM)
    self.moe = moe
    if moe:
      self.router, self.wi, self.wo = (param(DIM, EXPERTS), param(EXPERTS, DIM, HIDDEN),
                                       param(EXPERTS, HIDDEN, DIM))
    else:
      self.wi, self.wo = param(DIM, HIDDEN), param(HIDDEN, DIM)

  def __call__(self, x):
    b, t, _ = x.shape
    q, k, v = (jnp.einsum("btd,dnh->btnh", x, w[...]) for w in (self.q, self.k, self.v))
    logits = jnp.einsum("btnh,bsnh->bnts", q, k) / HEAD_DIM ** 0.5
    probs = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((t, t), bool)), logits, -1e9), -1)
    attn = jnp.einsum("bnts,bsnh->btnh", probs, v)
    x = x + lax.dot_general(attn, self.w_o[...], (((2, 3), (0, 1)), ((), ())))
    h = x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)
    if self.moe:
      flat = h.reshape(b * t, DIM)
      token, gates, sizes = route(flat @ self.router[...])
      up = lax.ragged_dot(flat[token], self.wi[...], sizes)
      down = lax.ragged_dot(jax.nn.gelu(up), self.wo[...], sizes)
      y = jnp.zeros_like(flat).at[token].add(down * gates[:, None]).reshape(b, t, DIM)
    else:
      y = jnp.dot(jax.nn.gelu(h @ self.wi[...]), self.wo[...])
    return x + y


class NnxLM(nnx.Module):
  def __init__(self, rngs: nnx.Rngs, moe: bool = False):
    self.table = nnx.Param(INIT(rngs.params(), (VOCAB, DIM)))

    @nnx.split_rngs(splits=LAYERS)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
      return NnxBlock(rngs, moe)

    self.layers = make(rngs)

  def __call__(self, tokens):
    x = self.table[...][tokens]

    @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
    def run(layer, x):
      return layer(x)

    x = run(self.layers, x)
    return x @ self.table[...].T
