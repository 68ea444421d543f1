"""The format sweep: a small byte-level LM trained and evaluated in every MX format.

Run it as `mxjax-sweep` or `python -m mxjax.sweep` (see `--help`). Pieces:

  corpus      the stdlib's .py sources as bytes: seeded file selection, split by file
  formats     the compared formats: name -> recipe, weight storage bytes per parameter
  model       the transformer; every linear layer an `mxjax.linen` module
  train       jitted AdamW step and evaluation under a recipe; weight fake-quantization
  checkpoint  the bf16 model's orbax checkpoint, reused by --mode ptq
  report      table, results.json, loss-curve PNG
"""
