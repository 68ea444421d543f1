"""Cost of the drop-in path: a train step of a stock-Flax model under
`mxjax.linen.intercept` against the same model built from `mxjax.linen` modules.

Both models are one transformer LM whose projections are `DenseGeneral`s: stock
`flax.linen.DenseGeneral` in one, `mxjax.linen.DenseGeneral` in the other (same
shapes, same params tree); the attention products are `jnp.einsum` in the stock model
(which `intercept` makes MX, as every product) and `mxjax.einsum` in the other. Each step
(loss, gradients, SGD update) runs under MXFP8, jitted; the bf16 step of the stock model
is printed for scale. Goal: intercepted / own modules within 1.05.

    python benchmarks/dropin.py [--d-model 256] [--layers 2] [--batch 16] [--seq 128]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import cpu_model, interleaved_medians  # noqa: E402

import mxjax  # noqa: E402


class LM(nn.Module):
  """tokens int[B, T] -> logits f32[B, T, 256], with `dense` as every projection."""

  dense: type
  einsum: Callable
  d_model: int
  layers: int
  heads: int = 4

  @nn.compact
  def __call__(self, tokens):
    d, h = self.d_model, self.heads
    x = nn.Embed(256, d)(tokens).astype(jnp.bfloat16)
    causal = jnp.tril(jnp.ones((tokens.shape[1],) * 2, bool))
    for i in range(self.layers):
      y = nn.LayerNorm(dtype=jnp.bfloat16)(x)
      q, k, v = (self.dense((h, d // h), dtype=jnp.bfloat16, name=f"{n}_{i}")(y)
                 for n in "qkv")
      s = self.einsum("bqhd,bkhd->bhqk", q, k) / (d // h) ** 0.5
      p = jax.nn.softmax(jnp.where(causal, s.astype(jnp.float32), -1e9)).astype(jnp.bfloat16)
      a = self.einsum("bhqk,bkhd->bqhd", p, v)
      x = x + self.dense(d, axis=(-2, -1), dtype=jnp.bfloat16, name=f"out_{i}")(a)
      y = nn.gelu(self.dense(4 * d, dtype=jnp.bfloat16, name=f"mlp_in_{i}")(
          nn.LayerNorm(dtype=jnp.bfloat16)(x)))
      x = x + self.dense(d, dtype=jnp.bfloat16, name=f"mlp_out_{i}")(y)
    return self.dense(256, dtype=jnp.bfloat16, name="head")(x).astype(jnp.float32)


def train_step(model):
  def step(params, batch):
    def loss_fn(params):
      logits = model.apply({"params": params}, batch[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), loss
  return step


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--d-model", type=int, default=256)
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--reps", type=int, default=15)
  args = parser.parse_args(argv)

  recipe = mxjax.MXFP8BlockScaling()
  mx_einsum = functools.partial(mxjax.einsum, fwd_format=recipe.fwd_format,
                                bwd_format=recipe.bwd_format)
  stock = LM(nn.DenseGeneral, jnp.einsum, args.d_model, args.layers)
  own = LM(mxjax.linen.DenseGeneral, mx_einsum, args.d_model, args.layers)
  batch = jax.random.randint(jax.random.key(0), (args.batch, args.seq + 1), 0, 256)
  params = stock.init(jax.random.key(1), batch[:, :-1])["params"]
  own_params = own.init(jax.random.key(1), batch[:, :-1])["params"]
  assert jax.tree.structure(own_params) == jax.tree.structure(params)

  steps = {}
  steps["bf16 (stock)"] = jax.jit(train_step(stock))
  with mxjax.autocast(recipe=recipe), mxjax.linen.intercept():
    steps["mxfp8 intercepted"] = jax.jit(train_step(stock)).lower(params, batch).compile()
  with mxjax.autocast(recipe=recipe):
    steps["mxfp8 mxjax modules"] = jax.jit(train_step(own)).lower(params, batch).compile()
  times = interleaved_medians(steps, params, batch, reps=args.reps)

  print(f"# {cpu_model()}, {os.cpu_count()} cores, "
        f"kernels: {mxjax.backend_info()['build']['simd']}; d_model {args.d_model}, "
        f"{args.layers} layers, batch {args.batch} x {args.seq}")
  for name, t in times.items():
    print(f"{name:22s} {1e3 * t:8.2f} ms")
  ratio = times["mxfp8 intercepted"] / times["mxfp8 mxjax modules"]
  print(f"intercepted / mxjax modules: {ratio:.3f} (goal <= 1.05)")


if __name__ == "__main__":
  main()
