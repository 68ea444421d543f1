"""Trains one Flax MLP built from `mxjax.linen.Dense` twice, in bf16 and under MXFP8
(`mxjax.autocast`), and prints the loss of both runs side by side.

The task: classify x ~ N(0, I_32) into 8 classes by a random linear teacher, with 10% of
the labels replaced at random (the best reachable loss is about 0.47).

    python examples/train_mlp.py [--steps 200] [--recipe mxfp8|mxfp8_hybrid|mxfp6|mxfp4|delayed|current]
"""

from __future__ import annotations

import argparse
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from mxjax import linen as mxl, state as state_lib
from mxjax._src import context
from mxjax._src.recipes import (DelayedScaling, Float8CurrentScaling, Format, MXFP4BlockScaling,
                           MXFP6BlockScaling, MXFP8BlockScaling)

RECIPES = {
    "mxfp8": MXFP8BlockScaling(),
    "mxfp8_hybrid": MXFP8BlockScaling(fp8_format=Format.HYBRID),
    "mxfp6": MXFP6BlockScaling(),
    "mxfp4": MXFP4BlockScaling(),
    "delayed": DelayedScaling(amax_history_len=16),
    "current": Float8CurrentScaling(),
}
NUM_CLASSES, DIM = 8, 32
TEACHER = jax.random.normal(jax.random.key(42), (DIM, NUM_CLASSES))


class MLP(nn.Module):
  """x [B, 32] -> logits [B, 8]: three mxjax Dense layers with GELUs, in `dtype`."""

  hidden: int = 128
  dtype: jnp.dtype = jnp.bfloat16

  @nn.compact
  def __call__(self, x):
    h = nn.gelu(mxl.Dense(self.hidden, dtype=self.dtype, name="fc1")(x))
    h = nn.gelu(mxl.Dense(self.hidden, dtype=self.dtype, name="fc2")(h))
    return mxl.Dense(NUM_CLASSES, dtype=self.dtype, name="out")(h)


def batch(key, n):
  """(x f32[n, 32], labels int32[n])."""
  k1, k2, k3 = jax.random.split(key, 3)
  x = jax.random.normal(k1, (n, DIM))
  labels = jnp.argmax(x @ TEACHER, -1)
  noisy = jax.random.uniform(k2, (n,)) < 0.1
  return x, jnp.where(noisy, jax.random.randint(k3, (n,), 0, NUM_CLASSES), labels)


def make_step(model, tx, batch_size):
  """A jitted step on (params, mx_state, opt_state); the recipe comes from autocast."""

  def loss_fn(params, mx_state, x, y):
    logits, mutated = model.apply({"params": params, "mx_state": mx_state}, x,
                                  mutable=["mx_state"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y)
    return loss.mean(), mutated["mx_state"]

  @jax.jit
  def step(params, mx_state, opt_state, key):
    x, y = batch(key, batch_size)
    (loss, mutated), (g_params, g_state) = jax.value_and_grad(
        loss_fn, argnums=(0, 1), has_aux=True)(params, mx_state, x, y)
    updates, opt_state = tx.update(g_params, opt_state, params)
    return (optax.apply_updates(params, updates), state_lib.next_state(g_state, mutated),
            opt_state, loss)

  return step


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--recipe", choices=sorted(RECIPES), default="mxfp8")
  parser.add_argument("--every", type=int, default=10, help="print every N steps")
  args = parser.parse_args(argv)

  model = MLP()
  recipe = RECIPES[args.recipe]
  tx = optax.adamw(3e-3, weight_decay=1e-4)
  step = make_step(model, tx, args.batch)
  runs = {"bf16": None, args.recipe: recipe}
  losses = {}
  for name, run_recipe in runs.items():
    with context.autocast(enabled=run_recipe is not None, recipe=run_recipe):
      variables = model.init(jax.random.key(0), jnp.zeros((1, DIM)))
      params, mx_state = variables["params"], variables["mx_state"]
      opt_state = tx.init(params)
      start, losses[name] = time.perf_counter(), []
      for i in range(args.steps):
        params, mx_state, opt_state, loss = step(params, mx_state, opt_state,
                                                 jax.random.fold_in(jax.random.key(1), i))
        losses[name].append(loss)
      losses[name] = [float(v) for v in losses[name]]
      print(f"{name}: {args.steps} steps in {time.perf_counter() - start:.1f} s "
            f"(recipe: {run_recipe})")

  names = list(runs)
  print(f"\n{'step':>6} " + " ".join(f"{n:>12}" for n in names))
  for i in range(0, args.steps, args.every):
    print(f"{i:>6} " + " ".join(f"{losses[n][i]:12.4f}" for n in names))
  tail = min(10, args.steps)
  last = {n: sum(losses[n][-tail:]) / tail for n in names}
  print(f"mean of the last {tail} steps: " + ", ".join(f"{n} {v:.4f}" for n, v in last.items()))


if __name__ == "__main__":
  main()
