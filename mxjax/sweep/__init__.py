"""The format sweep: a small byte-level LM trained and evaluated in every MX format.

Run it as `mxjax-sweep` or `python -m mxjax.sweep` (see `--help`). Pieces:

  corpus      the stdlib's .py sources as bytes: seeded file selection, split by file
  formats     the compared formats: names (every spelling) -> recipe, weight quantizer,
              weight storage bytes per parameter
  baselines   weight quantizers in jnp: INT8 per output channel, per-tensor FP8, MX
  model       the transformer; every linear layer an `mxjax.linen` module
  train       jitted AdamW step, calibration and evaluation under a row's treatment
              (recipe, tier rules, weight quantizer), run for every seed
  checkpoint  the bf16 model's orbax checkpoint, reused by --mode ptq
  report      per-seed runs, mean ± std and significance; table, results.json, PNG
"""
