"""The format sweep: formats, the model's mxjax layers, weight PTQ, checkpoint, CLI smoke."""

from __future__ import annotations

import functools
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
from mxjax import rules as rules_lib
from mxjax._src.context import autocast
from mxjax._src.quantize import fake_quantize
from mxjax._src.recipes import DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling
from mxjax.sweep import __main__ as cli
from mxjax.sweep import baselines, checkpoint, formats, report, train
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
  assert bpp == {"bf16": 2.0, "mxfp8_e4m3": 1 + 1 / 32, "mxfp8_e5m2": 1 + 1 / 32,
                 "mxfp8_hybrid": 1 + 1 / 32, "mxfp6_e3m2": 0.75 + 1 / 32,
                 "mxfp6_e2m3": 0.75 + 1 / 32, "mxfp4_e2m1": 0.5 + 1 / 32,
                 "fp8_delayed": 1.0, "fp8_current": 1.0, "int8_weight": 1.0,
                 # block-scaled rows: the weight role's elements + scale bytes per block
                 "nvfp4": 0.5 + 1 / 256, "nvfp4_no_sr": 0.5 + 1 / 256,
                 "nvfp4_no_rht": 0.5 + 1 / 256, "nvfp4_1d": 0.5 + 1 / 16,
                 "fp8_block": 1 + 4 / 128 ** 2, "mxfp4_sr": 0.5 + 1 / 32,
                 "mxfp4_rht": 0.5 + 1 / 32, "mxfp4_sr_rht": 0.5 + 1 / 32,
                 "mxfp8_2d": 1 + 1 / 32 ** 2}
  assert formats.FORMATS["mxfp4_e2m1"].bytes_per_param(16) == 0.5 + 1 / 16
  assert formats.FORMATS["bf16"].recipe() is None
  assert formats.FORMATS["int8_weight"].recipe() is None
  hybrid = formats.FORMATS["mxfp8_hybrid"].recipe(32, "floor")
  assert (hybrid.fwd_format, hybrid.bwd_format, hybrid.scale_mode) == ("e4m3", "e5m2", "floor")
  for name in ("mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1"):
    r = formats.FORMATS[name].recipe(16)
    assert r.fwd_format == r.bwd_format == formats.FORMATS[name].weight_format
    assert r.mx() and r.block_size == 16
  assert formats.FORMATS["fp8_delayed"].recipe() == DelayedScaling()
  assert formats.FORMATS["fp8_current"].recipe() == Float8CurrentScaling()
  assert formats.DEFAULT == ("bf16", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3",
                             "mxfp4_e2m1")


@pytest.mark.parametrize("width, element", [("fp8", "e4m3"), ("fp8", "e5m2"), ("fp6", "e3m2"),
                                            ("fp6", "e2m3"), ("fp4", "e2m1")])
def test_every_spelling_of_a_format_selects_one_canonical_row(width, element):
  canonical = f"mx{width}_{element}"
  for spelling in (f"{width}_{element}", element, canonical, element.upper(),
                   f"MX{width.upper()}-{element.upper()}"):
    chosen = formats.parse(f"bf16,{spelling}")
    assert [(f.name, f.given) for f in chosen] == [("bf16", "bf16"), (canonical, spelling)]
  # several spellings of one format: one row, recording the first name given
  chosen = formats.parse(f"{element},{width}_{element},{canonical}")
  assert [(f.name, f.given) for f in chosen] == [("bf16", "bf16"), (canonical, element)]


def test_other_rows_and_their_names():
  chosen = formats.parse("Hybrid,delayed,fp8_current,int8,bfloat16")
  assert [(f.name, f.given) for f in chosen] == [
      ("bf16", "bfloat16"), ("mxfp8_hybrid", "Hybrid"), ("fp8_delayed", "delayed"),
      ("fp8_current", "fp8_current"), ("int8_weight", "int8")]
  with pytest.raises(ValueError, match="'fp6_e4m3'"):  # no FP6 format is E4M3
    formats.parse("fp6_e4m3")


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
  printed jaxpr shows a sub-jaxpr used twice only once); of a per-platform `cond`
  (`lax.platform_dependent`) only the branch this backend runs."""
  found = []
  here = jax.default_backend()

  def params_walked(eqn):
    platforms = eqn.params.get("branches_platforms")
    if eqn.primitive.name != "cond" or not platforms:
      return eqn.params.values()
    runs = next((i for i, names in enumerate(platforms) if names and here in names),
                platforms.index(None))
    return [eqn.params["branches"][runs]]

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "ffi_call":
        found.append(eqn.params["target_name"])
      for param in params_walked(eqn):
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
  # Inference quantizes and dequantizes input and kernel in one pass each (fake_quantize);
  # training makes both quantized copies in one pass.
  assert quantized.count("mxjax_fake_quantize") >= 2 * gemms
  assert "mxjax_quantize_2x" not in quantized and "mxjax_quantize" not in quantized
  assert trained.count("mxjax_quantize_2x") >= 2 * gemms


@pytest.mark.parametrize("tier, reached", [
    ("all", ["block_0/qkv/dense", "block_0/out", "block_0/mlp/wi", "block_0/mlp/wo",
             "lm_head/dense"]),
    ("no_ends", ["block_0/out", "block_0/mlp/wi", "block_0/mlp/wo"]),
    ("mlp_only", ["block_0/mlp/wi", "block_0/mlp/wo"])])
def test_tier_reaches_the_gemms_its_rules_name(tiny, tier, reached):
  """A tier's rules pick the GEMMs the recipe quantizes (inference: input and kernel, one
  fused quantize-dequantize each) and the kernels a weight-only row quantizes."""
  lm, params = tiny
  tokens = jnp.zeros((2, 32), jnp.int32)
  rules = rules_lib.preset(tier, mxl.gemm_paths(lm, tokens))
  gemm = train.Treatment(MXFP8BlockScaling(), rules=rules)
  with gemm.context():
    targets = ffi_targets(jax.make_jaxpr(lambda p: lm.apply({"params": p}, tokens))(params))
  assert targets.count("mxjax_fake_quantize") == 2 * len(reached)
  weights = train.Treatment(weight_quantizer=jnp.zeros_like, rules=rules).weights(params)
  zeroed = [model_lib.layer_path(p) for p, w in model_lib.kernels(weights).items()
            if not np.any(w)]
  assert sorted(zeroed) == sorted(reached)


def test_map_kernels_only_touches_kernels(tiny):
  _, params = tiny
  q = model_lib.map_kernels(params, functools.partial(baselines.mx, fmt="e2m1"))
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
  only_mlp = model_lib.map_kernels(params, jnp.zeros_like, lambda layer: "mlp" in layer)
  for path, w in model_lib.kernels(only_mlp).items():
    assert (not np.any(w)) == ("mlp" in path), path


def test_int8_per_channel_weights():
  """Column scale = column amax / 127; here 2^-7 and 2^-6 (exact), so the codes are
  w / scale rounded to nearest, ties to even; a zero column stays zero."""
  u = 2.0 ** -7
  w = jnp.array([[127 * u, 254 * u, 0.0],
                 [0.5 * u, 3.0 * u, 0.0],   # 0.5 -> 0 (tie to even); 1.5 (col 1) -> 2
                 [-1.5 * u, -1.0 * u, 0.0]], jnp.float32)
  expected = jnp.array([[127 * u, 254 * u, 0.0],
                        [0.0, 4.0 * u, 0.0],
                        [-2.0 * u, 0.0, 0.0]], jnp.float32)  # -0.5 (col 1) -> 0
  np.testing.assert_array_equal(baselines.int8_per_channel(w), expected)
  cotangent = jnp.arange(9.0).reshape(3, 3)
  grad = jax.grad(lambda w: jnp.sum(baselines.int8_per_channel(w) * cotangent))(w)
  np.testing.assert_array_equal(grad, cotangent)  # straight through
  bf16 = baselines.int8_per_channel(w.astype(jnp.bfloat16))
  assert bf16.dtype == jnp.bfloat16


def test_fp8_per_tensor_weights():
  """amax 28: scale 448 / 28 = 16; 1.03125 * 16 = 16.5 lies between the E4M3 values 16
  and 18 and rounds to 16 (-> 1.0); 0.5 * 16 = 8 is on the grid."""
  w = jnp.array([[28.0, 1.03125], [0.5, -28.0]], jnp.float32)
  np.testing.assert_array_equal(baselines.fp8_per_tensor(w),
                                jnp.array([[28.0, 1.0], [0.5, -28.0]], jnp.float32))
  np.testing.assert_array_equal(baselines.fp8_per_tensor(jnp.zeros((2, 2))), jnp.zeros((2, 2)))


def _batches(n, seed=0):
  rng = np.random.default_rng(seed)
  return iter([rng.integers(0, 256, (2, 33), dtype=np.int32) for _ in range(n)])


def test_runner_advances_delayed_scaling_state(tiny):
  lm, params = tiny
  runner = train.Runner(lm, train.TrainConfig(steps=3), train.Treatment(DelayedScaling()), 32)
  start = runner.state0
  _, state, stats = runner.train(params, _batches(3), progress=False)
  assert len(stats.curve) == 3 and all(math.isfinite(v) for v in stats.curve)
  scalings = lambda tree: [t for s in jax.tree.leaves(  # noqa: E731
      tree, is_leaf=lambda x: hasattr(x, "tensors")) for t in s.tensors.values()]
  for before, after in zip(scalings(start), scalings(state), strict=True):
    for name in ("amax_history", "scale"):
      a, b = getattr(before, name), getattr(after, name)
      assert a.shape == b.shape and not np.array_equal(a, b)
    assert float(after.uses) == 1.0  # each layer runs once per step
  histories = [s.tensors["grad"].amax_history for s in jax.tree.leaves(
      state, is_leaf=lambda x: hasattr(x, "tensors"))]
  assert histories and all(np.count_nonzero(h) == 3 for h in histories)  # 3 steps recorded
  calibrated = runner.calibrate(params, _batches(2), 2)
  inputs = [s.tensors["input"].amax_history for s in jax.tree.leaves(
      calibrated, is_leaf=lambda x: hasattr(x, "tensors"))]
  assert all(np.count_nonzero(h) == 2 for h in inputs)
  stateless = train.Runner(lm, train.TrainConfig(steps=1), train.Treatment(), 32)
  assert not jax.tree.leaves(stateless.calibrate(params, _batches(1), 1))


def test_weight_only_treatment_runs_on_quantized_kernels(tiny):
  lm, params = tiny
  val = list(_batches(2, seed=1))
  int8 = train.Runner(lm, train.TrainConfig(steps=2),  # step 0 has learning rate 0
                      train.Treatment(weight_quantizer=baselines.int8_per_channel), 32)
  plain = train.Runner(lm, train.TrainConfig(steps=1), train.Treatment(), 32)
  quantized = model_lib.map_kernels(params, baselines.int8_per_channel)
  loss, _ = int8.evaluate(params, int8.state0, val)
  assert loss == plain.evaluate(quantized, plain.state0, val)[0]
  assert loss != plain.evaluate(params, plain.state0, val)[0]
  trained, _, _ = int8.train(params, _batches(2), progress=False)
  # QAT: the float params move (straight-through gradient), not only the quantized copy.
  moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), params, trained)
  assert all(jax.tree.leaves(moved))


def test_checkpoint_roundtrip_and_key(tmp_path, tiny):
  _, params = tiny
  key = dict(model="tiny", steps=3)
  checkpoint.save(str(tmp_path), 0, params, key, dict(curve=[1.0, 0.5], step_ms=2.0))
  params2, meta = checkpoint.load(str(tmp_path), 0, key, params)
  assert meta["curve"] == [1.0, 0.5]
  jax.tree.map(np.testing.assert_array_equal, params, params2)
  assert checkpoint.load(str(tmp_path), 0, dict(model="tiny", steps=4), params) is None
  assert checkpoint.load(str(tmp_path), 1, key, params) is None  # another seed's
  assert checkpoint.load(str(tmp_path / "nowhere"), 0, key, params) is None


def _row(name, quantized, val_losses, train_loss=None):
  return report.Row(name, quantized, 1.0, runs=[
      report.Run(seed, v, 10.0, train_loss) for seed, v in enumerate(val_losses)])


def test_table_marks_the_baseline():
  rows = [_row("bf16", "-", [2.0], 2.0), _row("mxfp4_e2m1", "fwd+bwd", [2.1], 2.2)]
  rows[1].bytes_per_param = 0.53125
  report.add_deltas(rows, rows[0])
  text = report.table(rows, "train")
  assert "+5.00%" in text and "+0.00%" in text and "0.5312" in text
  assert text.splitlines()[0].startswith("| format") and "2 SE" not in text


def test_seed_statistics_and_significance():
  """Δ is paired by seed: a row 1% above bf16 in every seed is significant however far
  apart the seeds are; deltas of +1% and +3% (mean 2, std sqrt(2), SE 1) are not above
  2 SE; +1% and +2% (mean 1.5, std 0.7071, SE 0.5) are."""
  rows = [_row("bf16", "-", [2.0, 4.0]), _row("a", "fwd+bwd", [2.02, 4.04]),
          _row("b", "fwd+bwd", [2.02, 4.12]), _row("c", "fwd+bwd", [2.02, 4.08])]
  report.add_deltas(rows, rows[0])
  base, a, b, c = rows
  assert (base.val_loss, base.val_loss_std) == pytest.approx((3.0, math.sqrt(2)))
  assert base.significant is None
  assert (a.delta_pct, a.delta_pct_std, a.significant) == (pytest.approx(1.0), pytest.approx(0),
                                                           True)
  assert (b.delta_pct, b.delta_pct_se, b.significant) == (pytest.approx(2.0), pytest.approx(1.0),
                                                          False)
  assert (c.delta_pct, c.delta_pct_se, c.significant) == (pytest.approx(1.5), pytest.approx(0.5),
                                                          True)
  lines = report.table(rows, "train").splitlines()
  assert "Δ > 2 SE" in lines[0]
  assert "3.0000 ± 1.4142" in lines[2] and "+1.50% ± 0.71%" in lines[5]
  assert [line.split("|")[7].strip() for line in lines[2:]] == ["-", "yes", "no", "yes"]
  summary = c.summary()
  assert summary["significant"] is True and [r["seed"] for r in summary["runs"]] == [0, 1]


def test_plot_shades_the_seed_spread():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  def curved(name, curves):
    row = report.Row(name, "fwd+bwd", 1.0)
    row.runs = [report.Run(i, c[-1], 1.0, c[-1], list(c)) for i, c in enumerate(curves)]
    return row

  one, two = curved("one", [[3.0, 2.0, 1.0]]), curved("two", [[3.0, 2.0, 1.0], [3.5, 2.5, 1.5]])
  for rows, bands in (([one], 0), ([one, two], 1)):
    fig, ax = plt.subplots()
    report._curves(ax, rows)
    fills = [c for c in ax.collections if "PolyCollection" in type(c).__name__]
    assert len(fills) == bands
    plt.close(fig)
  np.testing.assert_allclose(two.curve, [3.25, 2.25, 1.25])


def test_delta_panel_promises_error_bars_only_with_seeds():
  """One seed: the Δ bars carry no whiskers, no seed dots and no "2 SE" in the title;
  several: ±2 SE whiskers, one dot per seed, and * on a row beyond 2 SE. Each bar's
  label sits past the bar's end, not on it."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.container import ErrorbarContainer

  for seeds in (1, 3):
    base = _row("bf16", "-", [2.0, 2.1, 2.2][:seeds])
    near = _row("near", "fwd+bwd", [2.002, 2.1021, 2.2019][:seeds])
    far = _row("far", "fwd+bwd", [2.2, 2.31, 2.42][:seeds])
    report.add_deltas([base, near, far], base)
    fig, ax = plt.subplots()
    report._deltas(ax, [near, far])
    title = ax.get_title()
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    dots = [line for line in ax.lines if line.get_marker() == "o"]
    labels = {t.get_text(): t.xy[0] for t in ax.texts}
    plt.close(fig)
    if seeds == 1:
      assert "SE" not in title and not bars and not dots
      assert labels == {"+0.10%": pytest.approx(0.1), "+10.00%": pytest.approx(10.0)}
    else:
      assert "±2 SE" in title and len(bars) == 1 and len(dots) == 2
      assert all(len(d.get_xdata()) == 3 for d in dots)
      assert "+10.00% *" in labels and labels["+10.00% *"] >= 10.0


def test_difference_panel_pairs_each_seed_with_bf16():
  """The middle panel plots each format's smoothed loss minus bf16's of the same seed, in
  percent: a row 1% above bf16 at every step is a flat line at +1."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  def curved(name, quantized, curves):
    row = report.Row(name, quantized, 1.0)
    row.runs = [report.Run(i, c[-1], 1.0, c[-1], list(c)) for i, c in enumerate(curves)]
    return row

  base = curved("bf16", "-", [np.linspace(3, 2, 20), np.linspace(4, 2.5, 20)])
  plus = curved("plus", "fwd+bwd", [c * 1.01 for c in (np.linspace(3, 2, 20),
                                                      np.linspace(4, 2.5, 20))])
  fig, ax = plt.subplots()
  report._differences(ax, [base, plus], {"plus": "C1"})
  (line,) = [line for line in ax.lines if line.get_label() == "plus"]
  np.testing.assert_allclose(line.get_ydata(), 1.0, rtol=1e-9)
  plt.close(fig)


SMOKE = ["--steps", "3", "--d-model", "32", "--heads", "2", "--layers", "1", "--seq-len", "32",
         "--batch-size", "4", "--eval-batches", "2", "--max-samples", "16", "--no-progress"]
SMOKE_FORMATS = ["--formats", "bf16,fp4_e2m1,fp8_delayed,int8", "--seeds", "2"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("sweep")
  rc = cli.main(SMOKE + SMOKE_FORMATS + ["--out", str(out)])
  return out, rc, json.loads((out / "results.json").read_text())


def test_cli_train_smoke(smoke_run, capsys):
  out, rc, results = smoke_run
  assert rc == 0
  rows = results["rows"]
  assert [(r["format"], r["given"], r["quantized"]) for r in rows] == [
      ("bf16", "bf16", "-"), ("mxfp4_e2m1", "fp4_e2m1", "fwd+bwd"),
      ("fp8_delayed", "fp8_delayed", "fwd+bwd"), ("int8_weight", "int8", "weights")]
  assert results["seeds"] == [0, 1]
  for r in rows:
    assert [run["seed"] for run in r["runs"]] == [0, 1]
    for run in r["runs"]:
      assert len(run["curve"]) == 3 and all(math.isfinite(v) for v in run["curve"])
      assert math.isfinite(run["train_loss"]) and math.isfinite(run["val_loss"])
    assert r["val_loss"] == pytest.approx(np.mean([run["val_loss"] for run in r["runs"]]))
    assert r["val_loss_std"] == pytest.approx(np.std([run["val_loss"] for run in r["runs"]],
                                                     ddof=1))
    assert r["perplexity"] == pytest.approx(math.exp(r["val_loss"]))
  base = rows[0]["runs"]
  for r in rows[1:]:
    for run, b in zip(r["runs"], base):
      assert run["delta_pct"] == pytest.approx(100 * (run["val_loss"] / b["val_loss"] - 1))
  assert base[0]["val_loss"] != base[1]["val_loss"]  # other seed: other init and batches
  assert rows[0]["delta_pct"] == 0.0 and rows[0]["significant"] is None
  assert results["corpus"]["val_files"] and not (
      set(results["corpus"]["val_files"]) & set(results["corpus"]["train_files"]))
  with open(out / "loss_curves.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  for seed in (0, 1):
    assert (out / "bf16_checkpoint" / f"seed_{seed}" / "meta.json").is_file()
  md = (out / "results.md").read_text()
  assert "| bf16" in md and "| mxfp4_e2m1" in md and "Δ > 2 SE" in md


def test_cli_ptq_reuses_the_checkpoint(smoke_run, capsys):
  out, _, train_results = smoke_run
  train_rows = train_results["rows"]
  capsys.readouterr()
  assert cli.main(SMOKE + SMOKE_FORMATS + ["--out", str(out), "--mode", "ptq"]) == 0
  captured = capsys.readouterr()
  assert captured.err.count("loaded the bf16 model") == 2  # one per seed
  assert "| bf16" in captured.out and "weights+acts" in captured.out
  rows = json.loads((out / "results.json").read_text())["rows"]
  assert [(r["format"], r["quantized"]) for r in rows] == [
      ("bf16", "-"), ("mxfp4_e2m1", "weights"), ("mxfp4_e2m1", "weights+acts"),
      ("fp8_delayed", "weights"), ("fp8_delayed", "weights+acts"), ("int8_weight", "weights")]
  for run, trained in zip(rows[0]["runs"], train_rows[0]["runs"]):
    assert run["val_loss"] == pytest.approx(trained["val_loss"], rel=1e-6)
  assert all(math.isfinite(run["val_loss"]) for r in rows for run in r["runs"])
  assert os.path.isfile(out / "loss_curves.png")
  closing = captured.out.strip().splitlines()[-1]  # every output, by its path
  for name in ("results.md", "results.json", "loss_curves.png", "bf16_checkpoint/seed_0",
               "bf16_checkpoint/seed_1"):
    assert os.path.join(str(out), name) in closing, name


def test_cli_tier_keeps_the_ends_in_bf16(smoke_run, tmp_path):
  """--tier no_ends: the baseline is untouched, the quantized row changes (fewer GEMMs in
  MXFP4), and results.json names the GEMMs kept in bf16."""
  out, _, full = smoke_run
  assert full["tier"]["name"] == "all" and not full["tier"]["high_precision"]
  flags = SMOKE + ["--formats", "bf16,fp4_e2m1", "--tier", "no_ends", "--out", str(tmp_path)]
  assert cli.main(flags) == 0
  results = json.loads((tmp_path / "results.json").read_text())
  assert results["tier"]["high_precision"] == ["block_0/qkv/dense", "lm_head/dense"]
  assert results["tier"]["quantized"] == ["block_0/out", "block_0/mlp/wi", "block_0/mlp/wo"]
  train_bf16 = json.loads((out / "bf16_checkpoint" / "seed_0" / "meta.json").read_text())
  assert results["rows"][0]["runs"][0]["curve"] == train_bf16["curve"]
  tiered, everything = results["rows"][1]["runs"][0], full["rows"][1]["runs"][0]
  assert tiered["val_loss"] != everything["val_loss"]


@pytest.mark.parametrize("flags, message", [
    (["--formats", "bf16,fp7"], "unknown format(s) 'fp7'"),
    (["--seeds", "0"], "--seeds must be >= 1, got 0"),
    (["--tier", "mlp"], "argument --tier: invalid choice: 'mlp'"),
    (["--steps", "x"], "invalid int value: 'x'"),
    (["--out", "{file}/out"], "is not a writable directory"),
    (["--out", "{file}"], "is not a writable directory"),
])
def test_cli_rejects_bad_flags_in_one_line(tmp_path, capsys, flags, message):
  file = tmp_path / "a_file"
  file.write_text("")
  flags = [f.format(file=file) for f in flags]
  out = [] if "--out" in flags else ["--out", str(tmp_path / "out")]
  with pytest.raises(SystemExit) as info:
    cli.main(SMOKE + flags + out)
  assert info.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("mxjax-sweep: error: ") and message in err
  assert not list(tmp_path.rglob("results.json"))


def test_runner_feeds_stochastic_rounding_a_key_per_step(tiny):
  """A row with stochastic rounding trains (the 'mx' stream gets a key per step) and the
  seed fixes its bits: two runs of the same treatment give the same curve."""
  lm, params = tiny
  row = formats.FORMATS["mxfp4_sr"]
  runner = train.Runner(lm, train.TrainConfig(steps=3), train.Treatment.for_gemms(row), 32)
  assert runner.needs_rng
  _, _, a = runner.train(params, _batches(3), progress=False)
  _, _, b = runner.train(params, _batches(3), progress=False)
  assert all(math.isfinite(v) for v in a.curve) and a.curve == b.curve
