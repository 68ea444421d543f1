"""Every format: a PTQ row in `mxjax-eval` (`mxjax.sweep.evaluate.run`) for the sweep's
bf16 checkpoint (a tiny random-init one, saved as the sweep saves it): the kernels stored
with `quantize_params` at the format's bytes per param, the weights the row holds at the
formula, and a finite validation perplexity near bf16's.

One eval run makes all six rows (module fixture); d_model 128 so that FP8's 1x128 blocks
and 128x128 tiles fit whole contractions.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest

from format_cases import IDS, SWEEP_NAMES, WEIGHT_BYTES_PER_PARAM, every_format
from mxjax.sweep import checkpoint, evaluate
from mxjax.sweep import model as model_lib

CONFIG = dict(d_model=128, layers=1, heads=2, max_len=32, mlp_ratio=4, vocab=256)


@pytest.fixture(scope="module")
def eval_rows(tmp_path_factory):
  out = tmp_path_factory.mktemp("eval")
  lm = model_lib.LanguageModel(model_lib.ModelConfig(**CONFIG))
  params = jax.jit(lm.init)(jax.random.key(0), jnp.zeros((1, 32), jnp.int32))["params"]
  key = dict(model=CONFIG, seq_len=32, batch_size=4, max_samples=16, corpus_seed=0, seed=0)
  checkpoint.save(str(out), 0, params, key, {})
  args = evaluate.parser().parse_args([
      "--out", str(out), "--formats", ",".join(SWEEP_NAMES[n] for n in IDS),
      "--eval-batches", "1", "--gen-batch", "1", "--gen-tokens", "2"])
  rows = evaluate.run(args)
  return {r["format"]: r for r in rows}, model_lib.count_params(params)


@every_format
def test_ptq_row(name, eval_rows):
  rows, (n_params, n_kernel) = eval_rows
  base, row = rows["bf16"], rows[SWEEP_NAMES[name]]
  formula = WEIGHT_BYTES_PER_PARAM[name]
  assert row["tier"] == "all"
  assert row["kernel_bytes_per_param"] == pytest.approx(formula, rel=0.02)
  # every kernel stored (the tier "all"), everything else in bf16
  assert row["weight_bytes"] == pytest.approx(
      2 * (n_params - n_kernel) + n_kernel * formula, rel=0.01)
  assert row["weight_bytes"] < 0.6 * base["weight_bytes"]
  assert math.isfinite(row["perplexity"]) and row["tokens_per_s"] > 0
  assert abs(row["perplexity"] / base["perplexity"] - 1) < 0.05
