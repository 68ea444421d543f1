"""mxjax-eval: post-training quantization of the sweep's trained bf16 model, evaluated.

Loads the bf16 checkpoint that `mxjax-sweep` saved (under --out; its meta.json says the
model shape and the data), stores its kernels in each MX format with
`mxjax.quantize_params` (one copy, blocks along the contraction) for each tier of GEMMs,
and prints per row: validation perplexity, the weight bytes the live arrays hold, and
generation tokens/s (KV cache, jitted), next to bf16 (every weight in bf16):

  mxjax-sweep --steps 200 --out runs          # trains and saves the bf16 model
  mxjax-eval --out runs --formats mxfp8_e4m3,mxfp6_e2m3,mxfp4_e2m1 --tiers all,no_ends
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from mxjax._src import rules as rules_lib
from mxjax._src import context
from mxjax._src.mxarray import MXArray
from mxjax._src.ptq import quantize_params
from mxjax.sweep import checkpoint, corpus, formats, generate, train
from mxjax.sweep import model as model_lib

DEFAULT_FORMATS = ("mxfp8_e4m3", "mxfp6_e2m3", "mxfp4_e2m1", "nvfp4", "fp8_block")


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="mxjax-eval", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default="mxjax_sweep_out", help="the sweep's output directory")
  p.add_argument("--seed", type=int, default=0, help="which seed's bf16 model")
  p.add_argument("--formats", default=",".join(DEFAULT_FORMATS),
                 help="block-scaled formats (MX, NVFP4, FP8 blocks)")
  p.add_argument("--tiers", default="all", help=f"comma list of {', '.join(rules_lib.PRESETS)}")
  p.add_argument("--eval-batches", type=int, default=8, help="validation batches")
  p.add_argument("--gen-batch", type=int, default=8, help="sequences generated at once")
  p.add_argument("--gen-tokens", type=int, default=32, help="tokens generated per sequence")
  p.add_argument("--prompt", default="def ", help="the sample's prompt (bytes)")
  return p


def _is_mx(x) -> bool:
  return isinstance(x, MXArray)


def to_bf16(tree):
  """Every float array of `tree` in bfloat16 (MXArrays as they are)."""
  return jax.tree.map(lambda a: a if _is_mx(a) or not jnp.issubdtype(a.dtype, jnp.floating)
                      else a.astype(jnp.bfloat16), tree, is_leaf=_is_mx)


def tier_rules(params, tier: str) -> tuple[rules_lib.Rules, list]:
  """(layer rules of the tier, quantize_params rules keeping its high-precision kernels)."""
  layers = [model_lib.layer_path(p) for p in model_lib.kernels(params)]
  rules = rules_lib.preset(tier, layers)
  keep = [f"^{re.escape(layer)}/kernel$" for layer in layers
          if rules_lib.recipe_for(rules, layer, "mx") is None]
  return rules, [(pattern, None) for pattern in keep]


def held_bytes(tree) -> tuple[int, int]:
  """(bytes of `tree`'s arrays among jax.live_arrays, of those in MXArrays)."""
  leaves = jax.tree.leaves(tree)
  mx = {id(a) for k in jax.tree.leaves(tree, is_leaf=_is_mx) if _is_mx(k)
        for a in (k.data, k.scales, k.tensor_scale) if a is not None}
  ids = {id(a) for a in leaves}
  live = [a for a in jax.live_arrays() if id(a) in ids]
  return sum(a.nbytes for a in live), sum(a.nbytes for a in live if id(a) in mx)


def _contract_ndim(path: str) -> int:
  return model_lib.contraction_ndim(tuple(path.split("/")))


def evaluate_row(lm, params, recipe, layer_rules, val, prompt, gen_tokens: int) -> dict:
  """Perplexity over `val`, and generation tokens/s of `prompt` [B, P]; under `recipe`
  (None: bf16) and the tier's layer rules."""
  loss_fn = jax.jit(lambda p, b: train.cross_entropy(lm.apply({"params": p}, b[:, :-1]), b))
  with context.autocast(enabled=recipe is not None, recipe=recipe), \
       context.layer_rules(layer_rules):
    loss = float(np.mean([float(loss_fn(params, jnp.asarray(b))) for b in val]))
    key = jax.random.key(0)
    run = lambda: generate.generate(params, prompt, key, config=lm.config,  # noqa: E731
                                    steps=gen_tokens).block_until_ready()
    run()  # compile
    t0 = time.perf_counter()
    sample = run()
    seconds = time.perf_counter() - t0
  return dict(val_loss=loss, perplexity=math.exp(loss),
              tokens_per_s=prompt.shape[0] * gen_tokens / seconds,
              sample=bytes(np.asarray(sample[0], np.uint8)).decode("utf-8", "replace"))


def run(args) -> list[dict]:
  meta_path = os.path.join(checkpoint.directory(args.out, args.seed), "meta.json")
  if not os.path.isfile(meta_path):
    raise SystemExit(f"mxjax-eval: no bf16 checkpoint at {os.path.dirname(meta_path)}; "
                     f"train one with mxjax-sweep --out {args.out}")
  with open(meta_path) as f:
    key = json.load(f)["key"]
  config = model_lib.ModelConfig(**key["model"])
  lm = model_lib.LanguageModel(config, dtype=jnp.bfloat16)
  like = jax.eval_shape(lambda: train.init_params(lm, 0, key["seq_len"]))
  loaded = checkpoint.load(args.out, args.seed, key, like)
  if loaded is None:
    raise SystemExit(f"mxjax-eval: the checkpoint at {os.path.dirname(meta_path)} does not "
                     f"restore")
  params = loaded[0]
  data = corpus.load(max_files=key["max_samples"], seed=key["corpus_seed"])
  val = corpus.eval_batches(data.val, key["batch_size"], key["seq_len"], args.eval_batches)
  prompt_bytes = np.frombuffer(args.prompt.encode(), np.uint8).astype(np.int32)
  prompt = jnp.asarray(np.tile(prompt_bytes, (args.gen_batch, 1)))
  n_params, n_kernel = model_lib.count_params(params)

  rows = []
  bf16 = to_bf16(params)
  held, _ = held_bytes(bf16)
  rows.append(dict(format="bf16", tier="-", weight_bytes=held, kernel_bytes_per_param=2.0,
                   **evaluate_row(lm, bf16, None, (), val, prompt, args.gen_tokens)))
  for name in [n for n in args.formats.split(",") if n.strip()]:
    f = formats.FORMATS.get(formats.canonical(name) or "")
    if f is None or f.kind != "block_scaled":
      raise SystemExit(f"mxjax-eval: {name!r} is not a block-scaled format; choose from "
                       f"{', '.join(n for n, x in formats.FORMATS.items() if x.kind == 'block_scaled')}")
    recipe = f.recipe()
    for tier in [t.strip() for t in args.tiers.split(",") if t.strip()]:
      layer_rules, keep = tier_rules(params, tier)
      mx = to_bf16(quantize_params(params, recipe, keep, contract_ndim=_contract_ndim))
      held, held_mx = held_bytes(mx)
      n_mx = sum(k.size for k in jax.tree.leaves(mx, is_leaf=_is_mx) if _is_mx(k))
      rows.append(dict(format=f.name, tier=tier, weight_bytes=held,
                       kernel_bytes_per_param=held_mx / max(n_mx, 1),
                       **evaluate_row(lm, mx, recipe, layer_rules, val, prompt,
                                      args.gen_tokens)))
      del mx
  base = rows[0]
  for r in rows:
    r["bytes_vs_bf16"] = r["weight_bytes"] / base["weight_bytes"]
    r["speed_vs_bf16"] = r["tokens_per_s"] / base["tokens_per_s"]
  print(table(rows, n_params, n_kernel, config))
  print(f"\nsample ({rows[-1]['format']}, {rows[-1]['tier']}): {args.prompt!r} -> "
        f"{rows[-1]['sample']!r}")
  with open(os.path.join(args.out, "eval.json"), "w") as fh:
    json.dump(dict(rows=rows, model=key["model"], params=n_params, kernel_params=n_kernel,
                   device=jax.devices()[0].device_kind), fh, indent=1)
  return rows


def table(rows: list[dict], n_params: int, n_kernel: int, config) -> str:
  lines = [f"mxjax-eval: {n_params:,} params ({n_kernel:,} in kernels), d_model "
           f"{config.d_model}, {config.layers} layers; weights held = bytes of the live "
           f"arrays; {jax.devices()[0].device_kind}",
           "| format | tier | val ppl | weights held (KiB) | vs bf16 | kernel B/param "
           "| gen tok/s | vs bf16 |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['format']} | {r['tier']} | {r['perplexity']:.3f} | "
                 f"{r['weight_bytes'] / 1024:.1f} | {r['bytes_vs_bf16']:.3f} | "
                 f"{r['kernel_bytes_per_param']:.3f} | {r['tokens_per_s']:.0f} | "
                 f"{r['speed_vs_bf16']:.2f} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  args = parser().parse_args(argv)
  run(args)
  return 0


if __name__ == "__main__":
  sys.exit(main())
