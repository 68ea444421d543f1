"""mxjax-eval: PTQ of the sweep's bf16 checkpoint per format and tier, and KV-cache
generation (tiny model)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mxjax
from mxjax.sweep import checkpoint, evaluate, generate
from mxjax.sweep import model as model_lib

TINY = model_lib.ModelConfig(d_model=32, layers=1, heads=2, max_len=32)


def test_cached_generation_is_the_full_forward_greedy():
  """KV-cache decoding under jit gives the tokens that re-running the whole sequence
  picks greedily, from f32 params and from MXFP4 params (quantize_params) alike."""
  lm = model_lib.LanguageModel(TINY)
  prompt = jax.random.randint(jax.random.key(1), (2, 8), 0, 256)
  params = jax.jit(lm.init)(jax.random.key(0), prompt)["params"]
  recipe = mxjax.MXFP4BlockScaling()
  mx = mxjax.quantize_params(params, recipe, contract_ndim=evaluate._contract_ndim)
  for p, enabled in ((params, False), (mx, True)):
    with mxjax.autocast(enabled=enabled, recipe=recipe):
      out = generate.generate(p, prompt, jax.random.key(0), config=TINY, steps=6)
      # the whole sequence at once: each generated token is the argmax after its prefix
      logits = jax.jit(lm.apply)({"params": p}, jnp.concatenate([prompt, out], axis=1))
    np.testing.assert_array_equal(out, jnp.argmax(logits[:, 7:-1], axis=-1))


def test_eval_table_per_format_and_tier(tmp_path, capsys):
  lm = model_lib.LanguageModel(TINY)
  params = jax.jit(lm.init)(jax.random.key(0), jnp.zeros((1, 32), jnp.int32))["params"]
  key = dict(model=dict(d_model=32, layers=1, heads=2, max_len=32, mlp_ratio=4, vocab=256),
             seq_len=32, batch_size=4, max_samples=16, corpus_seed=0, seed=0)
  checkpoint.save(str(tmp_path), 0, params, key, {})
  assert evaluate.main(["--out", str(tmp_path), "--formats", "mxfp4_e2m1",
                        "--tiers", "all,no_ends", "--eval-batches", "1", "--gen-batch", "2",
                        "--gen-tokens", "4"]) == 0
  out = capsys.readouterr().out
  assert "| format | tier | val ppl" in out and "sample (" in out
  rows = json.loads((tmp_path / "eval.json").read_text())["rows"]
  assert [(r["format"], r["tier"]) for r in rows] == [
      ("bf16", "-"), ("mxfp4_e2m1", "all"), ("mxfp4_e2m1", "no_ends")]
  n_params, n_kernel = model_lib.count_params(params)
  assert rows[0]["weight_bytes"] == 2 * n_params  # every weight in bf16
  for r, bits in zip(rows[1:], (4, 4)):
    assert r["kernel_bytes_per_param"] == pytest.approx(bits / 8 + 1 / 32, rel=0.02)
    assert r["weight_bytes"] < rows[0]["weight_bytes"]
    assert r["tokens_per_s"] > 0 and np.isfinite(r["perplexity"])
  all4 = rows[1]
  assert all4["weight_bytes"] == pytest.approx(
      2 * (n_params - n_kernel) + n_kernel * (0.5 + 1 / 32), rel=0.01)
  assert rows[2]["weight_bytes"] > all4["weight_bytes"]  # no_ends keeps some in bf16
  assert abs(rows[1]["perplexity"] / rows[0]["perplexity"] - 1) < 0.1
