"""The format sweep: formats, the model's mxjax layers, weight PTQ, checkpoint, CLI smoke."""

from __future__ import annotations

import json
import math
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jax_core

from mxjax import linen as mxl
from mxjax.context import autocast
from mxjax.quantize import fake_quantize
from mxjax.recipes import MXFP8BlockScaling
from mxjax.sweep import __main__ as cli
from mxjax.sweep import checkpoint, formats, report, train
from mxjax.sweep import model as model_lib

TINY = model_lib.ModelConfig(d_model=32, layers=1, heads=2, max_len=32)


@pytest.fixture(scope="module")
def tiny():
  lm = model_lib.LanguageModel(TINY)
  return lm, train.init_params(lm, 0, 32)


def test_format_names_and_storage():
  chosen = formats.parse("mxfp4_e2m1, mxfp8_e4m3")
  assert [f.name for f in chosen] == ["bf16", "mxfp4_e2m1", "mxfp8_e4m3"]
  with pytest.raises(ValueError, match="unknown format"):
    formats.parse("bf16,fp3")
  bpp = {n: f.bytes_per_param(32) for n, f in formats.FORMATS.items()}
  assert bpp == {"bf16": 2.0, "mxfp8_e4m3": 1 + 1 / 32, "mxfp8_hybrid": 1 + 1 / 32,
                 "mxfp6_e3m2": 0.75 + 1 / 32, "mxfp6_e2m3": 0.75 + 1 / 32,
                 "mxfp4_e2m1": 0.5 + 1 / 32}
  assert formats.FORMATS["mxfp4_e2m1"].bytes_per_param(16) == 0.5 + 1 / 16
  assert formats.FORMATS["bf16"].recipe() is None
  hybrid = formats.FORMATS["mxfp8_hybrid"].recipe(32, "floor")
  assert (hybrid.fwd_format, hybrid.bwd_format, hybrid.scale_mode) == ("e4m3", "e5m2", "floor")
  for name in ("mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1"):
    r = formats.FORMATS[name].recipe()
    assert r.fwd_format == formats.FORMATS[name].weight_format


def test_every_linear_layer_is_an_mxjax_module(tiny):
  lm, params = tiny
  seen = []

  def record(next_fun, args, kwargs, context):
    if context.method_name == "__call__":
      seen.append(context.module)
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    lm.apply({"params": params}, jnp.zeros((1, 8), jnp.int32))
  owners = [m for m in seen if m.has_variable("params", "kernel")]
  # per block: qkv, out, mlp wi and wo; plus the LM head
  assert len(owners) == 4 * TINY.layers + 1
  assert all(isinstance(m, mxl.DenseGeneral) for m in owners)
  assert not any(type(m) in (nn.Dense, nn.DenseGeneral) for m in seen)
  assert len(model_lib.kernels(params)) == 4 * TINY.layers + 1


def ffi_targets(closed_jaxpr) -> list[str]:
  """The target of every ffi_call in a jaxpr, sub-jaxprs included, once per use (the
  printed jaxpr shows a sub-jaxpr used twice only once)."""
  found = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "ffi_call":
        found.append(eqn.params["target_name"])
      for param in eqn.params.values():
        for sub in param if isinstance(param, (tuple, list)) else (param,):
          if isinstance(sub, jax_core.ClosedJaxpr):
            walk(sub.jaxpr)
          elif isinstance(sub, jax_core.Jaxpr):
            walk(sub)

  walk(closed_jaxpr.jaxpr)
  return found


def test_jaxpr_quantizes_every_gemm_under_autocast(tiny):
  lm, params = tiny
  tokens = jnp.zeros((2, 32), jnp.int32)
  fwd = lambda p: lm.apply({"params": p}, tokens)  # noqa: E731
  assert not ffi_targets(jax.make_jaxpr(fwd)(params))
  with autocast(recipe=MXFP8BlockScaling()):
    quantized = ffi_targets(jax.make_jaxpr(fwd)(params))
    trained = ffi_targets(jax.make_jaxpr(jax.grad(lambda p: jnp.sum(fwd(p))))(params))
  gemms = 4 * TINY.layers + 1
  # Inference quantizes input and kernel rowwise; training makes both copies in one pass.
  assert quantized.count("mxjax_quantize") >= 2 * gemms
  assert "mxjax_quantize_2x" not in quantized
  assert trained.count("mxjax_quantize_2x") >= 2 * gemms


def test_quantize_weights_only_touches_kernels(tiny):
  _, params = tiny
  q = train.quantize_weights(params, "e2m1")
  kernels, qkernels = model_lib.kernels(params), model_lib.kernels(q)
  for path, w in kernels.items():
    wq = qkernels[path]
    assert wq.shape == w.shape and wq.dtype == w.dtype
    assert not np.array_equal(np.asarray(wq), np.asarray(w))
    w2 = wq.reshape(math.prod(w.shape[:model_lib.contraction_ndim(path)]), -1)
    again = fake_quantize(w2, "e2m1", axis=0)  # on the grid already: a fixed point
    np.testing.assert_array_equal(np.asarray(again), np.asarray(w2))
  flat = dict(jax.tree_util.tree_leaves_with_path(params))
  for keypath, leaf in jax.tree_util.tree_leaves_with_path(q):
    if keypath[-1].key != "kernel":
      np.testing.assert_array_equal(np.asarray(leaf), np.asarray(flat[keypath]))


def test_checkpoint_roundtrip_and_key(tmp_path, tiny):
  _, params = tiny
  key = dict(model="tiny", steps=3)
  checkpoint.save(str(tmp_path), params, key, dict(curve=[1.0, 0.5], step_ms=2.0))
  params2, meta = checkpoint.load(str(tmp_path), key, params)
  assert meta["curve"] == [1.0, 0.5]
  jax.tree.map(np.testing.assert_array_equal, params, params2)
  assert checkpoint.load(str(tmp_path), dict(model="tiny", steps=4), params) is None
  assert checkpoint.load(str(tmp_path / "nowhere"), key, params) is None


def test_table_marks_the_baseline():
  rows = [report.Row("bf16", "-", 2.0, 2.0, 10.0, 2.0),
          report.Row("mxfp4_e2m1", "fwd+bwd", 2.2, 2.1, 12.0, 0.53125)]
  report.add_deltas(rows, rows[0])
  text = report.table(rows, "train")
  assert "+5.00%" in text and "+0.00%" in text and "0.5312" in text
  assert text.splitlines()[0].startswith("| format")


SMOKE = ["--steps", "3", "--d-model", "32", "--heads", "2", "--layers", "1", "--seq-len", "32",
         "--batch-size", "4", "--eval-batches", "2", "--max-samples", "16",
         "--formats", "bf16,mxfp4_e2m1", "--no-progress"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("sweep")
  return out, cli.main(SMOKE + ["--out", str(out)])


def test_cli_train_smoke(smoke_run, capsys):
  out, rc = smoke_run
  assert rc == 0
  with open(out / "results.json") as f:
    results = json.load(f)
  rows = results["rows"]
  assert [(r["format"], r["quantized"]) for r in rows] == [("bf16", "-"),
                                                           ("mxfp4_e2m1", "fwd+bwd")]
  for r in rows:
    assert len(r["curve"]) == 3 and all(math.isfinite(v) for v in r["curve"])
    assert math.isfinite(r["train_loss"]) and math.isfinite(r["val_loss"])
    assert r["perplexity"] == pytest.approx(math.exp(r["val_loss"]))
  assert rows[0]["delta_pct"] == 0.0
  assert results["corpus"]["val_files"] and not (
      set(results["corpus"]["val_files"]) & set(results["corpus"]["train_files"]))
  with open(out / "loss_curves.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert (out / "bf16_checkpoint" / "meta.json").is_file()
  assert "| bf16" in (out / "results.md").read_text()


def test_cli_ptq_reuses_the_checkpoint(smoke_run, capsys):
  out, _ = smoke_run
  train_rows = json.loads((out / "results.json").read_text())["rows"]
  capsys.readouterr()
  assert cli.main(SMOKE + ["--out", str(out), "--mode", "ptq"]) == 0
  captured = capsys.readouterr()
  assert "loaded the bf16 model" in captured.err
  assert "| bf16" in captured.out and "weights+acts" in captured.out
  rows = json.loads((out / "results.json").read_text())["rows"]
  assert [(r["format"], r["quantized"]) for r in rows] == [
      ("bf16", "-"), ("mxfp4_e2m1", "weights"), ("mxfp4_e2m1", "weights+acts")]
  assert rows[0]["val_loss"] == pytest.approx(train_rows[0]["val_loss"], rel=1e-6)
  assert all(math.isfinite(r["val_loss"]) for r in rows)
  assert os.path.isfile(out / "loss_curves.png")


def test_cli_rejects_unknown_format(capsys):
  with pytest.raises(SystemExit):
    cli.main(["--formats", "bf16,fp7"])
  assert "unknown format" in capsys.readouterr().err
