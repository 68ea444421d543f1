"""Trains the sweep's small byte-level LM in bf16 for a few steps, stores its kernels in an
MX format after training (`mxjax.quantize_params`, one copy each) and prints a sample
generated with a KV cache under jit, from the bf16 and from the MX weights.

    python examples/generate.py [--steps 300] [--format mxfp4_e2m1] [--prompt "def "]

`mxjax-eval` runs the same conversion over formats and tiers and reports perplexity,
bytes and tokens/s.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import mxjax
from mxjax.sweep import corpus, formats, generate, train
from mxjax.sweep import model as model_lib


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--format", default="mxfp4_e2m1")
  p.add_argument("--prompt", default="def ")
  p.add_argument("--tokens", type=int, default=48)
  args = p.parse_args()

  config = model_lib.ModelConfig(d_model=128, layers=2, heads=4, max_len=128)
  lm = model_lib.LanguageModel(config)
  data = corpus.load(max_files=64)
  runner = train.Runner(lm, train.TrainConfig(steps=args.steps), train.Treatment.for_gemms(
      formats.FORMATS["bf16"]), seq_len=64)
  params, _, stats = runner.train(train.init_params(lm, 0, 64),
                                  corpus.train_batches(data.train, 16, 64), progress=False)
  print(f"trained {args.steps} steps in bf16: loss {train.final_loss(stats.curve):.3f}")

  recipe = formats.FORMATS[formats.canonical(args.format)].recipe()
  mx = mxjax.quantize_params(params, recipe, contract_ndim=lambda path: (
      model_lib.contraction_ndim(tuple(path.split("/")))))
  report = mxjax.memory_report(mx)
  print(f"{args.format} kernels: {report.quantized_bytes_per_param:.3f} B/param, "
        f"{report.quantized_nbytes / 2**10:.0f} KiB "
        f"(f32: {report.quantized_f32_nbytes / 2**10:.0f} KiB)")
  prompt = jnp.asarray(np.frombuffer(args.prompt.encode(), np.uint8).astype(np.int32))[None]
  for name, weights, rec in (("bf16", params, None), (args.format, mx, recipe)):
    with mxjax.autocast(enabled=rec is not None, recipe=rec):
      out = generate.generate(weights, prompt, jax.random.key(0), config=config,
                              steps=args.tokens, temperature=0.7)
    text = bytes(np.asarray(out[0], np.uint8)).decode("utf-8", "replace")
    print(f"--- {name} sample ---\n{args.prompt}{text}")


if __name__ == "__main__":
  main()
