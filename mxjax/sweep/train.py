"""Training and evaluation loops of the sweep: one jitted AdamW step under a row's
`Treatment` (autocast recipe, GEMM rules, weight quantizer); every run of a seed starts
from the same params and batches, only the treatment differs."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from mxjax._src import rules as rules_lib
from mxjax._src import state as state_lib
from mxjax._src.context import autocast, layer_rules
from mxjax._src.recipes import Recipe
from mxjax.sweep import formats as formats_lib
from mxjax.sweep import model as model_lib


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """How each run trains.

  Attributes:
    steps: optimizer steps.
    learning_rate: peak AdamW learning rate (linear warmup, cosine decay to 10%).
    warmup, weight_decay, clip_norm: warmup steps (at most steps // 5), AdamW decay of
      the matrices, global gradient-norm clip.
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
  """What one training run measured: the loss of every step, the median ms of a step after
  the first, the first step's seconds (with compilation) and the run's."""

  curve: list[float]
  step_ms: float
  compile_s: float
  seconds: float


def final_loss(curve: Sequence[float], window: int = 10) -> float:
  """Mean training loss over the last `window` steps (one step's loss is noisy)."""
  tail = list(curve)[-window:]
  return float(np.mean(tail)) if tail else float("nan")


def init_params(model: model_lib.LanguageModel, seed: int, seq_len: int):
  """The model's float32 params from `seed` (initialized in high precision)."""
  tokens = jnp.zeros((1, seq_len), jnp.int32)
  with autocast(enabled=False):
    return model.init(jax.random.key(seed), tokens)["params"]


def cross_entropy(logits, batch):
  """Mean next-byte cross entropy (nats) of logits f32[B, T, V] for `batch` int32[B, T + 1]."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()


def loss_fn(model: model_lib.LanguageModel, params, batch):
  """Mean next-byte cross entropy (nats) of `batch` int32[B, T + 1]."""
  return cross_entropy(model.apply({"params": params}, batch[:, :-1]), batch)


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


@dataclasses.dataclass(frozen=True)
class Treatment:
  """How one row computes: its GEMMs' recipe, which GEMMs it reaches, its weights.

  Attributes:
    recipe: the autocast recipe; None: GEMMs in the model's dtype.
    weight_quantizer: `w [K, N] -> quantize-dequantize of w` (straight-through) applied
      to the kernels before every forward pass (weight-only rows), or None.
    rules: `(regex, recipe | None)` layer rules (`mxjax.rules`, a tier) for the recipe and
      `weight_quantizer` alike; () reaches every GEMM.
  """

  recipe: Recipe | None = None
  weight_quantizer: Callable | None = None
  rules: tuple = ()

  @classmethod
  def for_gemms(cls, f: formats_lib.SweepRow, block_size: int = 32,
                scale_mode: str = "rceil", rules: tuple = ()) -> "Treatment":
    """Row `f`'s GEMM recipe (weight-only rows: its kernels quantized instead)."""
    if f.kind == "weight_only":
      return cls.weights_only(f, block_size, scale_mode, rules)
    return cls(recipe=f.recipe(block_size, scale_mode), rules=rules)

  @classmethod
  def weights_only(cls, f: formats_lib.SweepRow, block_size: int = 32,
                   scale_mode: str = "rceil", rules: tuple = ()) -> "Treatment":
    """PTQ weights only: the kernels quantize-dequantized as row `f` stores them."""
    return cls(weight_quantizer=f.weight_quantizer(block_size, scale_mode), rules=rules)

  @contextlib.contextmanager
  def context(self):
    """The autocast (and interception of the rules) the row's model runs under."""
    with contextlib.ExitStack() as stack:
      stack.enter_context(autocast(enabled=self.recipe is not None, recipe=self.recipe))
      if self.rules:
        stack.enter_context(layer_rules(self.rules))
      yield

  def quantizes(self, layer: str) -> bool:
    """Whether the rules leave the GEMM layer at path `layer` to the row's quantization."""
    rule = rules_lib.match(self.rules, layer)
    return rule is None or rule[1] is not None

  def weights(self, params):
    """The params the forward pass uses (kernels quantized for weight-only rows)."""
    if self.weight_quantizer is None:
      return params
    return model_lib.map_kernels(params, self.weight_quantizer, self.quantizes)


class Runner:
  """Training, calibration and evaluation of one treatment, each jitted once for all seeds.

  A stateful recipe's "mx_state" collection is carried next to the params and advanced as
  `mxjax.state` describes; otherwise the state is an empty dict.
  """

  def __init__(self, model: model_lib.LanguageModel, config: TrainConfig,
               treatment: Treatment, seq_len: int):
    self.model, self.config, self.treatment = model, config, treatment
    self.tx = optimizer(config)
    self.stateful = treatment.recipe is not None and treatment.recipe.stateful()
    self.state0 = {}
    if self.stateful:
      tokens = jnp.zeros((1, seq_len), jnp.int32)
      with treatment.context():
        self.state0 = jax.jit(lambda key: model.init(key, tokens)[
            state_lib.STATE_COLLECTION])(jax.random.key(0))
    # Stochastic rounding draws its bits from Flax's "mx" rng stream: a new key per step.
    self.needs_rng = treatment.recipe is not None and treatment.recipe.needs_rng()
    self.step = jax.jit(self._step)
    self._forward = jax.jit(self._apply)

  def _apply(self, params, state, batch, key=None):
    """(loss, state after the forward) of `batch` int32[B, T + 1]; `key`: the "mx" rng."""
    params = self.treatment.weights(params)
    rngs = {"mx": key} if key is not None else {}
    if not self.stateful:
      return cross_entropy(self.model.apply({"params": params}, batch[:, :-1], rngs=rngs),
                           batch), state
    logits, mutated = self.model.apply(
        {"params": params, state_lib.STATE_COLLECTION: state}, batch[:, :-1],
        mutable=[state_lib.STATE_COLLECTION], rngs=rngs)
    return cross_entropy(logits, batch), mutated[state_lib.STATE_COLLECTION]

  def _step(self, params, state, opt_state, batch, key=None):
    """(params, state, opt_state, loss) after one AdamW step on `batch` int32[B, T + 1]."""
    (loss, mutated), (g_params, g_state) = jax.value_and_grad(
        self._apply, argnums=(0, 1), has_aux=True)(params, state, batch, key)
    updates, opt_state = self.tx.update(g_params, opt_state, params)
    next_state = state_lib.next_state(g_state, mutated) if self.stateful else state
    return optax.apply_updates(params, updates), next_state, opt_state, loss

  def train(self, params, batches: Iterator[np.ndarray], desc: str = "train",
            progress: bool = True):
    """(trained params, recipe state, RunStats) of `config.steps` steps of `batches`."""
    state, opt_state = self.state0, self.tx.init(params)
    curve, times = [], []
    start = time.perf_counter()
    bar = tqdm(total=self.config.steps, desc=desc, disable=not progress, leave=True,
               dynamic_ncols=True)
    bar.set_postfix_str("compiling")
    with self.treatment.context():
      for i in range(self.config.steps):
        batch = jnp.asarray(next(batches))
        t0 = time.perf_counter()
        key = (jax.random.fold_in(jax.random.key(self.config.seed + 7919), i)
               if self.needs_rng else None)
        params, state, opt_state, loss = self.step(params, state, opt_state, batch, key)
        loss = float(loss)  # waits for the step
        times.append(time.perf_counter() - t0)
        curve.append(loss)
        if i == 0:  # the first step compiled: the rate (and ETA) starts from here
          bar.reset()
        bar.update(1)
        if i % 10 == 0 or i == self.config.steps - 1:
          bar.set_postfix(loss=f"{loss:.3f}")
    bar.close()
    steady = times[1:] or times
    stats = RunStats(curve, 1e3 * float(np.median(steady)) if steady else float("nan"),
                     times[0] if times else 0.0, time.perf_counter() - start)
    return params, state, stats

  def calibrate(self, params, batches: Iterator[np.ndarray], count: int):
    """The recipe state after `count` forward passes over `batches` (stateful recipes)."""
    state = self.state0
    if not self.stateful:
      return state
    with self.treatment.context():
      for _ in range(count):
        _, state = self._forward(params, state, jnp.asarray(next(batches)))
    return state

  def evaluate(self, params, state, batches: Sequence[np.ndarray]) -> tuple[float, float]:
    """(mean cross entropy in nats per byte, median ms per batch after the first)."""
    losses, times = [], []
    with self.treatment.context():
      for b in batches:
        t0 = time.perf_counter()
        losses.append(float(self._forward(params, state, jnp.asarray(b))[0]))
        times.append(time.perf_counter() - t0)
    if not losses:
      return float("nan"), float("nan")
    return float(np.mean(losses)), 1e3 * float(np.median(times[1:] or times))
