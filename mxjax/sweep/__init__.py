"""The format sweep: a small byte-level LM trained and evaluated in every MX format.

Run it as `mxjax-sweep` or `python -m mxjax.sweep` (see `--help`); `mxjax-eval` evaluates
PTQ of its bf16 model.
"""
