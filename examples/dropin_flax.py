"""Trains a transformer LM, unmodified, in bf16 and in MXFP8 through
`mxjax.linen.intercept`, prints which products ran MX (`mxjax.coverage`) and both losses.

Two models, neither of which knows about mxjax: `--model stock` uses only `flax.linen`
layers (Embed, LayerNorm, MultiHeadDotProductAttention, Dense); `--model own` is written
as model libraries (Gemma, MaxText) write theirs: its own `Einsum` modules calling
`jnp.einsum`, attention by einsum, and a tied LM head `x @ table.T`. The MXFP8 run is the
same training loop inside

    with mxjax.autocast(recipe=mxjax.MXFP8BlockScaling()), mxjax.linen.intercept(rules):

and its params tree is the bf16 run's, so either checkpoint loads into the other. The
data: byte windows of the Python standard library's own .py files.

    python examples/dropin_flax.py [--model stock|own] [--steps 150]
                                   [--tier all|no_ends|mlp_only|no_attention]
"""

from __future__ import annotations

import argparse
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import mxjax
from mxjax.sweep import corpus


class Block(nn.Module):
  """Pre-norm transformer block: x [B, T, D] -> [B, T, D]."""

  heads: int
  dtype: jnp.dtype

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    h = nn.LayerNorm(dtype=self.dtype)(x)
    mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
    x = x + nn.MultiHeadDotProductAttention(self.heads, dtype=self.dtype)(h, h, mask=mask)
    h = nn.LayerNorm(dtype=self.dtype)(x)
    h = nn.gelu(nn.Dense(4 * d, dtype=self.dtype)(h))
    return x + nn.Dense(d, dtype=self.dtype)(h)


class TransformerLM(nn.Module):
  """Byte-level LM: tokens int[B, T] -> logits f32[B, T, 256]."""

  d_model: int = 128
  layers: int = 2
  heads: int = 4
  max_len: int = 256
  dtype: jnp.dtype = jnp.bfloat16

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(256, self.d_model)(tokens)
    x = x + nn.Embed(self.max_len, self.d_model)(jnp.arange(tokens.shape[1]))
    for _ in range(self.layers):
      x = Block(self.heads, self.dtype)(x)
    x = nn.LayerNorm(dtype=self.dtype)(x)
    return nn.Dense(256, dtype=self.dtype, name="lm_head")(x).astype(jnp.float32)


class Einsum(nn.Module):
  """A model library's own projection: a param and `jnp.einsum` (no stock layer)."""

  shape: tuple[int, ...]

  @nn.compact
  def __call__(self, equation: str, x):
    w = self.param("w", nn.initializers.normal(self.shape[0] ** -0.5), self.shape)
    return jnp.einsum(equation, x, w.astype(x.dtype))


class OwnBlock(nn.Module):
  """Pre-norm block with its own einsum projections: x [B, T, D] -> [B, T, D]."""

  heads: int

  @nn.compact
  def __call__(self, x):
    d, h = x.shape[-1], self.heads
    y = nn.RMSNorm(dtype=x.dtype)(x)
    q, k, v = (Einsum((d, h, d // h), name=n)("btd,dnh->btnh", y) for n in "qkv")
    logits = jnp.einsum("btnh,bsnh->bnts", q, k).astype(jnp.float32) / (d // h) ** 0.5
    causal = jnp.tril(jnp.ones(logits.shape[-2:], bool))
    probs = jax.nn.softmax(jnp.where(causal, logits, -1e9)).astype(x.dtype)
    x = x + Einsum((h, d // h, d), name="o")("btnh,nhd->btd",
                                             jnp.einsum("bnts,bsnh->btnh", probs, v))
    y = nn.gelu(Einsum((d, 4 * d), name="up")("btd,df->btf", nn.RMSNorm(dtype=x.dtype)(x)))
    return x + Einsum((4 * d, d), name="down")("btf,fd->btd", y)


class OwnEinsumLM(nn.Module):
  """Gemma-style byte LM with a tied head: tokens int[B, T] -> logits f32[B, T, 256]."""

  d_model: int = 128
  layers: int = 2
  heads: int = 4
  dtype: jnp.dtype = jnp.bfloat16

  @nn.compact
  def __call__(self, tokens):
    table = self.param("embedding", nn.initializers.normal(0.05), (256, self.d_model))
    x = table[tokens].astype(self.dtype)
    for _ in range(self.layers):
      x = OwnBlock(self.heads)(x)
    x = nn.RMSNorm(dtype=self.dtype)(x)
    return (x @ table.T.astype(self.dtype)).astype(jnp.float32)


def loss_fn(model, params, batch):
  logits = model.apply({"params": params}, batch[:, :-1])
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()


def train(model, params, data, recipe, rules, steps, tx):
  """Trains from `params` under `recipe` (None: bf16), every product intercepted.

  Returns:
    (train losses per step, final validation loss).
  """

  @jax.jit
  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(lambda p: loss_fn(model, p, batch))(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  evaluate = jax.jit(lambda params, batch: loss_fn(model, params, batch))
  batches = corpus.train_batches(data.train, 16, 64, seed=0)
  opt_state, losses = tx.init(params), []
  with mxjax.autocast(enabled=recipe is not None, recipe=recipe), mxjax.linen.intercept(rules):
    for _ in range(steps):
      params, opt_state, loss = step(params, opt_state, next(batches))
      losses.append(loss)
    val = np.mean([evaluate(params, b) for b in corpus.eval_batches(data.val, 16, 64, 8)])
  return [float(v) for v in losses], float(val)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", choices=("stock", "own"), default="stock",
                      help="stock Flax layers, or a model's own einsum modules")
  parser.add_argument("--steps", type=int, default=150)
  parser.add_argument("--tier", choices=mxjax.rules.PRESETS, default="all",
                      help="which GEMMs run MXFP8 (mxjax.rules presets)")
  parser.add_argument("--every", type=int, default=25, help="print every N steps")
  args = parser.parse_args(argv)

  data = corpus.load(max_files=64)
  model = TransformerLM() if args.model == "stock" else OwnEinsumLM()
  sample = jnp.zeros((1, 64), jnp.int32)
  params = model.init(jax.random.key(0), sample)["params"]
  rules = mxjax.rules.preset(args.tier, mxjax.linen.gemm_paths(model, sample))
  with mxjax.autocast(recipe=mxjax.MXFP8BlockScaling()), mxjax.linen.intercept(rules):
    print(mxjax.coverage(model.apply, {"params": params}, sample), end="\n\n")
  tx = optax.adamw(2e-3, weight_decay=1e-4)
  runs = {"bf16": None, "mxfp8": mxjax.MXFP8BlockScaling()}
  losses, val = {}, {}
  for name, recipe in runs.items():
    start = time.perf_counter()
    losses[name], val[name] = train(model, params, data, recipe, rules, args.steps, tx)
    print(f"{name}: {args.steps} steps in {time.perf_counter() - start:.1f} s")
  print(f"\n{'step':>6} " + " ".join(f"{n:>10}" for n in runs))
  for i in sorted({*range(0, args.steps, args.every), args.steps - 1}):
    print(f"{i:>6} " + " ".join(f"{losses[n][i]:10.4f}" for n in runs))
  print("validation loss: " + ", ".join(f"{n} {v:.4f}" for n, v in val.items()) +
        f" (mxfp8 {100 * (val['mxfp8'] / val['bf16'] - 1):+.2f}%, tier {args.tier})")


if __name__ == "__main__":
  main()
