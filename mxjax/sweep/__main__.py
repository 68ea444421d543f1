"""mxjax-sweep: train and evaluate a small byte-level LM in every MX format.

The corpus is the Python standard library's own .py files (no download). Every run of a
seed starts from that seed's initial params and sees its batches; the bf16 baseline runs
in the same invocation, and every other row is compared with it.

Modes:
  train  quantization-aware training: one run per format and seed, the GEMMs --tier picks
         (forward and gradients) under the format's recipe (int8_weight: bf16 GEMMs on
         quantized weights, straight-through); validation the same way.
  ptq    post-training quantization of the bf16 model (loaded from OUT/bf16_checkpoint/
         seed_S when made with the same settings, else trained and saved): its weights
         quantized as the format stores them (weights), and weights and activations under
         the recipe (weights+acts; fp8_delayed calibrates on 8 training batches).

Formats (any spelling: the MX evaluation harnesses' fp8_e4m3, mxjax's e4m3, mxfp8_e4m3):
  bf16                        the baseline (always run)
  mxfp8_e4m3 mxfp8_e5m2       MXFP8, the element format forward and backward
  mxfp8_hybrid                MXFP8 E4M3 forward, E5M2 gradients
  mxfp6_e3m2 mxfp6_e2m3       MXFP6
  mxfp4_e2m1                  MXFP4
  nvfp4                       NVFP4 (TE): E2M1, E4M3 scales per 16, FP32 tensor scale,
                              16x16 weights, SR gradients, RHT on the wgrad operands
  nvfp4_no_sr nvfp4_no_rht nvfp4_1d   NVFP4 with one of its three knobs off (ablations)
  mxfp4_sr mxfp4_rht mxfp4_sr_rht     MXFP4 + stochastic rounding and / or RHT
  fp8_block                   DeepSeek-V3 FP8 (TE Float8BlockScaling): 1x128 / 128x128, pow2
  mxfp8_2d                    MXFP8 E4M3 with 32x32 weight tiles
  fp8_delayed fp8_current     per-tensor FP8 (DelayedScaling, Float8CurrentScaling; HYBRID)
  int8_weight                 INT8 weights, one scale per output channel, bf16 GEMMs
Rows show the canonical (first) name; results.json also records the name given.

--tier picks which GEMMs a row quantizes (mxjax.rules presets, applied with
mxjax.linen.intercept; weight-only rows quantize the same kernels): all; no_ends (the
first and last GEMM and the LM head stay bf16); mlp_only (only the MLPs' GEMMs).

Outputs: a table on stdout (and OUT/results.md), OUT/results.json, OUT/loss_curves.png,
and the bf16 params in OUT/bf16_checkpoint/seed_S (for --mode ptq and mxjax-eval).
With --seeds N every row runs under N seeds (init and data order): the table gives
mean ± std of the validation loss and of Δ (against bf16 of the same seed), and marks Δ
significant beyond 2 standard errors (std / sqrt(N)); the PNG shows the spread.

Examples:
  mxjax-sweep                                   # the demo: bf16 + 5 MX formats, CPU
  mxjax-sweep --formats bf16,fp8_e4m3,fp8_e5m2,fp6_e3m2,fp6_e2m3,fp4_e2m1 --steps 60
  mxjax-sweep --formats e4m3,fp8_delayed,fp8_current,int8_weight --seeds 3
  mxjax-sweep --mode ptq --formats bf16,mxfp8_e4m3,mxfp4_e2m1
  mxjax-sweep --scale-mode floor --out floor_sweep

The defaults (d_model 128, 2 layers, seq 64, batch 16, 200 steps, one seed) run the six
default rows in about two minutes on an idle 2-core CPU; formats within a few tenths of a
percent of bf16 are then at the noise level (use --seeds). Larger settings separate the
formats more reliably, e.g. on an accelerator:
  mxjax-sweep --d-model 256 --layers 4 --heads 8 --seq-len 256 --batch-size 32 \\
      --steps 2000 --max-samples 1000 --eval-batches 32
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import tempfile
import time
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
from tqdm.auto import tqdm

from mxjax import linen as mxl
from mxjax._src import rules as rules_lib
from mxjax.sweep import checkpoint, corpus, formats, report, train
from mxjax.sweep import model as model_lib

CHECKPOINT_VERSION = 2
#: Training batches a stateful recipe (fp8_delayed) sees to fill its amax history in PTQ.
CALIBRATION_BATCHES = 8


class _Parser(argparse.ArgumentParser):
  """argparse, whose errors are one line (no usage block) and exit code 2."""

  def error(self, message: str) -> NoReturn:
    self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
  p = _Parser(prog="mxjax-sweep", description=__doc__,
              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--formats", default=",".join(formats.DEFAULT),
                 help="comma list of formats, default %(default)s (bf16 is always run, as "
                 "the baseline; see above for all names)")
  p.add_argument("--mode", choices=("train", "ptq"), default="train",
                 help="train: QAT per format; ptq: quantize the trained bf16 model")
  p.add_argument("--tier", choices=rules_lib.PRESETS, default="all",
                 help="which GEMMs are quantized: all; no_ends (not the first and last GEMM "
                 "nor the LM head); mlp_only (mxjax.rules presets)")
  p.add_argument("--seeds", type=int, default=1,
                 help="seeds per row (--seed, --seed + 1, ...): mean ± std and significance")
  p.add_argument("--steps", type=int, default=200, help="training steps per run")
  p.add_argument("--batch-size", type=int, default=16, help="sequences per step")
  p.add_argument("--seq-len", type=int, default=64, help="bytes per sequence")
  p.add_argument("--max-samples", type=int, default=256,
                 help="stdlib .py files drawn for the corpus (10%% held out by file)")
  p.add_argument("--eval-batches", type=int, default=16,
                 help="validation batches (of --batch-size windows)")
  p.add_argument("--scale-mode", choices=("rceil", "floor"), default="rceil",
                 help="MX shared-exponent rule")
  p.add_argument("--block-size", type=int, choices=(16, 32, 64), default=32,
                 help="elements per E8M0 scale")
  p.add_argument("--d-model", type=int, default=128, help="residual width")
  p.add_argument("--layers", type=int, default=2, help="transformer blocks")
  p.add_argument("--heads", type=int, default=4, help="attention heads")
  p.add_argument("--lr", type=float, default=1e-3, help="peak AdamW learning rate")
  p.add_argument("--seed", type=int, default=0,
                 help="corpus selection; the first seed of init and data order")
  p.add_argument("--out", default="mxjax_sweep_out", help="output directory")
  p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
  return p


def _log(msg: str) -> None:
  tqdm.write(msg, file=sys.stderr)


@dataclasses.dataclass
class _Sweep:
  """What every run of one invocation shares: data, model, initial params, settings."""

  args: argparse.Namespace
  formats: list[formats.SweepRow]
  data: corpus.Corpus
  config: model_lib.ModelConfig
  lm: model_lib.LanguageModel
  train_config: train.TrainConfig
  params0: dict[int, Any]  # seed -> initial params
  val: list
  rules: tuple = ()  # the tier's layer rules

  @property
  def seeds(self) -> list[int]:
    return list(self.params0)

  def batches(self, seed: int):
    a = self.args
    return corpus.train_batches(self.data.train, a.batch_size, a.seq_len, seed=seed)

  def runner(self, treatment: train.Treatment) -> train.Runner:
    return train.Runner(self.lm, self.train_config, treatment, self.args.seq_len)

  def gemm_treatment(self, f: formats.SweepRow) -> train.Treatment:
    a = self.args
    return train.Treatment.for_gemms(f, a.block_size, a.scale_mode, self.rules)

  def weights_treatment(self, f: formats.SweepRow) -> train.Treatment:
    a = self.args
    return train.Treatment.weights_only(f, a.block_size, a.scale_mode, self.rules)

  def row(self, f: formats.SweepRow, quantized: str) -> report.Row:
    return report.Row(f.name, quantized, f.bytes_per_param(self.args.block_size), f.given)

  def checkpoint_key(self, seed: int) -> dict:
    """Everything the bf16 params of `seed` depend on."""
    a = self.args
    return dict(version=CHECKPOINT_VERSION, model=dataclasses.asdict(self.config),
                train=dataclasses.asdict(self.train_config), batch_size=a.batch_size,
                seq_len=a.seq_len, max_samples=a.max_samples, corpus_seed=a.seed, seed=seed,
                corpus_files=list(self.data.train_files))

  def train_baseline(self, runner: train.Runner, seed: int):
    """Trains the bf16 model of `seed` and checkpoints it: (params, RunStats)."""
    params, _, stats = runner.train(self.params0[seed], self.batches(seed),
                                    desc=f"bf16 seed {seed}",
                                    progress=not self.args.no_progress)
    checkpoint.save(self.args.out, seed, params, self.checkpoint_key(seed),
                    dict(curve=stats.curve, step_ms=stats.step_ms))
    return params, stats


def _train_rows(s: _Sweep) -> list[report.Row]:
  """QAT: per format and seed, one run from the seed's params and batches, validated under
  its treatment."""
  rows = []
  for f in s.formats:
    runner = s.runner(s.gemm_treatment(f))
    row = s.row(f, "-" if f.is_baseline else
                ("weights" if f.kind == "weight_only" else "fwd+bwd"))
    for seed in s.seeds:
      if f.is_baseline:
        params, stats = s.train_baseline(runner, seed)
        state = runner.state0
      else:
        params, state, stats = runner.train(s.params0[seed], s.batches(seed),
                                            desc=f"{f.name} seed {seed}",
                                            progress=not s.args.no_progress)
      val_loss, _ = runner.evaluate(params, state, s.val)
      row.runs.append(report.Run(seed, val_loss, stats.step_ms,
                                 train.final_loss(stats.curve), stats.curve))
      _log(f"{f.name} seed {seed}: train loss {row.runs[-1].train_loss:.4f}, val loss "
           f"{val_loss:.4f}, step {stats.step_ms:.1f} ms")
    rows.append(row)
  return rows


def _ptq_rows(s: _Sweep) -> list[report.Row]:
  """PTQ: per seed, the bf16 model (loaded or trained); per format its weights alone
  quantized and (formats with a recipe) weights and activations under the recipe."""
  base = s.formats[0]
  bf16 = s.runner(s.gemm_treatment(base))
  rows = {(base.name, "-"): s.row(base, "-")}
  treatments = {}
  for f in s.formats[1:]:
    treatments[f.name, "weights"] = s.weights_treatment(f)
    if f.make_recipe is not None:
      treatments[f.name, "weights+acts"] = s.gemm_treatment(f)
  runners = {key: s.runner(t) for key, t in treatments.items()}
  by_name = {f.name: f for f in s.formats}
  for (name, kind) in runners:
    rows[name, kind] = s.row(by_name[name], kind)
  for seed in s.seeds:
    loaded = checkpoint.load(s.args.out, seed, s.checkpoint_key(seed), s.params0[seed])
    if loaded is not None:
      params, meta = loaded
      curve = list(meta["curve"])
      _log(f"ptq: loaded the bf16 model from {checkpoint.directory(s.args.out, seed)}")
    else:
      _log(f"ptq: no compatible bf16 checkpoint for seed {seed}; training one")
      params, stats = s.train_baseline(bf16, seed)
      curve = stats.curve
    val_loss, eval_ms = bf16.evaluate(params, bf16.state0, s.val)
    rows[base.name, "-"].runs.append(report.Run(seed, val_loss, eval_ms,
                                                train.final_loss(curve), curve))
    for (name, kind), runner in runners.items():
      state = runner.calibrate(params, s.batches(seed), CALIBRATION_BATCHES)
      loss, ms = runner.evaluate(params, state, s.val)
      rows[name, kind].runs.append(report.Run(seed, loss, ms))
      _log(f"{name} ({kind}) seed {seed}: val loss {loss:.4f}")
  return list(rows.values())


def _fail(message: str) -> NoReturn:
  parser().error(message)


def _check_args(args: argparse.Namespace) -> list[formats.SweepRow]:
  """The formats to run; exits (one line, code 2) on a bad flag before any output."""
  try:
    sweep_formats = formats.parse(args.formats)
  except ValueError as e:
    _fail(str(e))
  for name in ("seeds", "steps", "batch_size", "seq_len", "max_samples", "eval_batches",
               "d_model", "layers", "heads"):
    if getattr(args, name) < 1:
      _fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
  if args.d_model % args.heads:
    _fail(f"--d-model {args.d_model} must be a multiple of --heads {args.heads}")
  try:  # the output directory must take files before hours of training
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryFile(dir=args.out):
      pass
  except OSError as e:
    _fail(f"--out {args.out!r} is not a writable directory ({e.strerror or e})")
  return sweep_formats


def main(argv=None) -> int:
  args = parser().parse_args(argv)
  sweep_formats = _check_args(args)
  start = time.perf_counter()

  data = corpus.load(max_files=args.max_samples, seed=args.seed)
  config = model_lib.ModelConfig(d_model=args.d_model, layers=args.layers, heads=args.heads,
                                 max_len=args.seq_len)
  lm = model_lib.LanguageModel(config, dtype=jnp.bfloat16)
  seeds = [args.seed + i for i in range(args.seeds)]
  layers = [p for p in mxl.gemm_paths(lm, jnp.zeros((1, args.seq_len), jnp.int32))
            if not p.activations]  # the GEMM layers (attention's own products stay bf16)
  s = _Sweep(args, sweep_formats, data, config, lm,
             train.TrainConfig(steps=args.steps, learning_rate=args.lr, seed=args.seed),
             {seed: train.init_params(lm, seed, args.seq_len) for seed in seeds},
             corpus.eval_batches(data.val, args.batch_size, args.seq_len, args.eval_batches),
             rules_lib.preset(args.tier, layers))
  reached = train.Treatment(rules=s.rules).quantizes
  tier = dict(name=args.tier, quantized=[p for p in layers if reached(p)],
              high_precision=[p for p in layers if not reached(p)])
  total, in_kernels = model_lib.count_params(s.params0[args.seed])
  _log(f"mxjax-sweep: mode={args.mode} formats={','.join(f.name for f in sweep_formats)} "
       f"seeds={seeds} tier={args.tier} scale_mode={args.scale_mode} block={args.block_size}")
  _log(f"tier {args.tier}: {len(tier['quantized'])} of {len(layers)} GEMMs quantized"
       + (f"; high precision: {', '.join(tier['high_precision'])}"
          if tier["high_precision"] else ""))
  _log(f"corpus: {data.summary()}")
  _log(f"model: {config} ({total:,} params, {in_kernels:,} in MX-quantizable GEMM kernels)")

  rows = _train_rows(s) if args.mode == "train" else _ptq_rows(s)
  report.add_deltas(rows, rows[0])
  seconds = time.perf_counter() - start
  text = report.table(rows, args.mode)
  title = (f"mxjax-sweep {args.mode}: d_model {args.d_model}, {args.layers} layers, "
           f"seq {args.seq_len}, batch {args.batch_size}, {args.steps} steps, "
           f"{args.scale_mode}, block {args.block_size}"
           + (f", tier {args.tier}" if args.tier != "all" else "")
           + (f", {args.seeds} seeds (mean ± std)" if args.seeds > 1 else ""))
  meta = dict(mode=args.mode, seeds=seeds, tier=tier, args=vars(args),
              model=dataclasses.asdict(config), train=dataclasses.asdict(s.train_config),
              corpus=dict(root=data.root, train_files=list(data.train_files),
                          val_files=list(data.val_files), train_bytes=int(data.train.size),
                          val_bytes=int(data.val.size)),
              params=dict(total=total, in_kernels=in_kernels), seconds=seconds,
              environment=_environment())
  png_path = report.plot(args.out, rows, args.mode, title)
  md_path = os.path.join(args.out, "results.md")
  with open(md_path, "w") as f:
    f.write(f"{title}\n\n{text}\n")
  json_path = report.write_json(args.out, rows, meta)
  print(title)
  print(text)
  outputs = [f"{md_path} (this table)", f"{json_path} (every run and its curve)",
             f"{png_path} (the plot)"]
  outputs += [f"{os.path.join(args.out, checkpoint.DIRNAME, f'seed_{seed}')} (the bf16 "
              "params: --mode ptq, mxjax-eval)" for seed in seeds
              if os.path.isdir(checkpoint.directory(args.out, seed))]
  print(f"wrote {', '.join(outputs)} ({seconds:.1f} s total)")
  return 0


def _environment() -> dict:
  env = dict(jax=jax.__version__, backend=jax.default_backend(),
             devices=[str(d) for d in jax.devices()], python=platform.python_version(),
             machine=platform.machine(), cpus=os.cpu_count())
  try:
    from mxjax._src import extension
    env["mxjax_ffi"] = extension.build_info()
  except Exception as e:  # noqa: BLE001 - informational only
    env["mxjax_ffi"] = f"unavailable: {type(e).__name__}"
  return env


if __name__ == "__main__":
  sys.exit(main())
