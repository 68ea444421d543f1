"""Training and evaluation loops of the sweep: one jitted AdamW step, run under a recipe.

Every run starts from the same initial params and sees the same batches in the same
order; only the recipe of the enclosing `mxjax.context.autocast` differs. The step is
jitted per run, so it is traced under that run's recipe.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from mxjax.context import autocast
from mxjax.quantize import fake_quantize
from mxjax.recipes import Recipe
from mxjax.sweep import model as model_lib


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """How each run trains.

  Attributes:
    steps: optimizer steps.
    learning_rate: peak AdamW learning rate (linear warmup, cosine decay to 10%).
    warmup: warmup steps (capped at steps // 5).
    weight_decay: AdamW decay of the matrices (embeddings, kernels).
    clip_norm: global gradient-norm clip.
    seed: params init seed (the data order has its own seed, the same for every run).
  """

  steps: int = 200
  learning_rate: float = 1e-3
  warmup: int = 20
  weight_decay: float = 0.1
  clip_norm: float = 1.0
  seed: int = 0


@dataclasses.dataclass
class RunStats:
  """What one training run measured.

  Attributes:
    curve: the training loss of every step.
    step_ms: median wall time of a step after the first (the first compiles).
    compile_s: wall time of the first step (trace + compile + run).
    seconds: wall time of the whole run.
  """

  curve: list[float]
  step_ms: float
  compile_s: float
  seconds: float

  def final_loss(self) -> float:
    return final_loss(self.curve)


def final_loss(curve: Sequence[float], window: int = 10) -> float:
  """Mean training loss over the last `window` steps (one step's loss is noisy)."""
  tail = list(curve)[-window:]
  return float(np.mean(tail)) if tail else float("nan")


def init_params(model: model_lib.LanguageModel, seed: int, seq_len: int):
  """The model's float32 params from `seed` (initialized in high precision)."""
  tokens = jnp.zeros((1, seq_len), jnp.int32)
  with autocast(enabled=False):
    return model.init(jax.random.key(seed), tokens)["params"]


def loss_fn(model: model_lib.LanguageModel, params, batch):
  """Mean next-byte cross entropy (nats) of `batch` int32[B, T + 1]."""
  logits = model.apply({"params": params}, batch[:, :-1])
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()


def optimizer(config: TrainConfig) -> optax.GradientTransformation:
  warmup = max(1, min(config.warmup, config.steps // 5))
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, config.learning_rate, warmup, max(config.steps, warmup + 1),
      end_value=config.learning_rate * 0.1)
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
  return optax.chain(
      optax.clip_by_global_norm(config.clip_norm),
      optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=config.weight_decay,
                  mask=decay_mask))


def train(model: model_lib.LanguageModel, params, batches: Iterator[np.ndarray],
          config: TrainConfig, recipe: Recipe | None, desc: str = "train",
          progress: bool = True):
  """Trains `params` for `config.steps` steps of `batches` under `recipe`.

  Args:
    model: the LM.
    params: the initial float32 params (not modified).
    batches: int32[B, T + 1] batches; `config.steps` are drawn.
    recipe: the autocast recipe; None trains in plain `model.dtype`.
    desc: the progress bar's label.

  Returns:
    (trained params, RunStats).
  """
  tx = optimizer(config)

  @jax.jit
  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(lambda p: loss_fn(model, p, batch))(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = tx.init(params)
  curve, times = [], []
  start = time.perf_counter()
  bar = tqdm(range(config.steps), desc=desc, disable=not progress, leave=True,
             dynamic_ncols=True)
  with autocast(enabled=recipe is not None, recipe=recipe):
    for i in bar:
      batch = jnp.asarray(next(batches))
      t0 = time.perf_counter()
      params, opt_state, loss = step(params, opt_state, batch)
      loss = float(loss)  # waits for the step
      times.append(time.perf_counter() - t0)
      curve.append(loss)
      if i % 10 == 0 or i == config.steps - 1:
        bar.set_postfix(loss=f"{loss:.3f}")
  bar.close()
  steady = times[1:] or times
  stats = RunStats(curve, 1e3 * float(np.median(steady)) if steady else float("nan"),
                   times[0] if times else 0.0, time.perf_counter() - start)
  return params, stats


def evaluate(model: model_lib.LanguageModel, params, batches: Sequence[np.ndarray],
             recipe: Recipe | None) -> tuple[float, float]:
  """Mean cross entropy (nats per byte) over `batches`, computed under `recipe`.

  Returns:
    (mean loss, median ms per batch after the first).
  """

  @jax.jit
  def batch_loss(params, batch):
    return loss_fn(model, params, batch)

  losses, times = [], []
  with autocast(enabled=recipe is not None, recipe=recipe):
    for b in batches:
      t0 = time.perf_counter()
      losses.append(float(batch_loss(params, jnp.asarray(b))))
      times.append(time.perf_counter() - t0)
  if not losses:
    return float("nan"), float("nan")
  return float(np.mean(losses)), 1e3 * float(np.median(times[1:] or times))


def quantize_weights(params, fmt: str, block_size: int = 32, scale_mode: str = "rceil"):
  """Params with every GEMM kernel fake-quantized (quantize-dequantize) along its
  contraction: each kernel viewed as [K, N], blocks of `block_size` along K, as the MX
  GEMM blocks it. Other params (norms, biases, embeddings) are left as they are."""
  targets = model_lib.kernels(params)

  @functools.partial(jax.jit, static_argnums=1)
  def fq(w, ndim: int):
    k = math.prod(w.shape[:ndim])
    w2 = fake_quantize(w.reshape(k, -1), fmt, axis=0, block_size=block_size,
                       scale_mode=scale_mode)
    return w2.reshape(w.shape)

  def visit(keypath, leaf):
    path = tuple(getattr(k, "key", str(k)) for k in keypath)
    if path in targets:
      return fq(leaf, model_lib.contraction_ndim(path))
    return leaf

  return jax.tree_util.tree_map_with_path(visit, params)
