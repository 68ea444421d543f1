"""The sweep's outputs: a table on stdout, `results.json`, and a PNG of the loss curves."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Sequence

import numpy as np

RESULTS_JSON = "results.json"
PLOT_PNG = "loss_curves.png"


@dataclasses.dataclass
class Row:
  """One line of the table.

  Attributes:
    format: the sweep format name (e.g. "mxfp8_e4m3").
    quantized: what was quantized: "-" (baseline), "fwd+bwd" (QAT), "weights" or
      "weights+acts" (PTQ).
    train_loss: final training loss (mean of the last steps), None if not trained here.
    val_loss: mean validation cross entropy, nats per byte.
    step_ms: median train step (train mode) or eval batch (ptq mode) time, ms.
    bytes_per_param: MX storage of one weight, scales included (bf16: 2).
    curve: per-step training losses (empty for PTQ rows).
  """

  format: str
  quantized: str
  train_loss: float | None
  val_loss: float
  step_ms: float
  bytes_per_param: float
  curve: list[float] = dataclasses.field(default_factory=list)
  delta_pct: float | None = None

  @property
  def perplexity(self) -> float:
    return math.exp(self.val_loss) if math.isfinite(self.val_loss) else float("nan")


def add_deltas(rows: Sequence[Row], baseline: Row) -> None:
  """Sets each row's `delta_pct`: its validation loss vs the baseline's, in percent."""
  for r in rows:
    r.delta_pct = 100.0 * (r.val_loss - baseline.val_loss) / baseline.val_loss


def _fmt(value, spec: str) -> str:
  if value is None:
    return "-"
  if isinstance(value, float) and not math.isfinite(value):
    return "nan"
  return format(value, spec)


def table(rows: Sequence[Row], mode: str) -> str:
  """The results as an aligned text table (a Markdown table)."""
  time_header = "step ms" if mode == "train" else "eval ms"
  header = ["format", "quantized", "train loss", "val loss", "ppl", "Δ val loss",
            time_header, "bytes/param"]
  lines = [[r.format, r.quantized, _fmt(r.train_loss, ".4f"), _fmt(r.val_loss, ".4f"),
            _fmt(r.perplexity, ".3f"), _fmt(r.delta_pct, "+.2f") + ("%" if r.delta_pct
                                                                     is not None else ""),
            _fmt(r.step_ms, ".1f"), _fmt(r.bytes_per_param, ".4f")] for r in rows]
  widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
  left = {0, 1}

  def render(cells):
    return "| " + " | ".join(c.ljust(w) if i in left else c.rjust(w)
                             for i, (c, w) in enumerate(zip(cells, widths))) + " |"

  rule = "|" + "|".join(("-" * (w + 1) + ":") if i not in left else ("-" * (w + 2))
                        for i, w in enumerate(widths)) + "|"
  return "\n".join([render(header), rule] + [render(line) for line in lines])


def write_json(out_dir: str, rows: Sequence[Row], meta: dict[str, Any]) -> str:
  """Writes `results.json` (meta + rows with their curves); returns its path."""
  path = os.path.join(out_dir, RESULTS_JSON)
  data = dict(meta)
  data["rows"] = [dict(dataclasses.asdict(r), perplexity=r.perplexity) for r in rows]
  with open(path, "w") as f:
    json.dump(data, f, indent=1, default=_json_default, allow_nan=True)
  return path


def _json_default(value):
  if isinstance(value, (np.floating, np.integer)):
    return value.item()
  return str(value)


def _smooth(curve: Sequence[float], alpha: float) -> np.ndarray:
  out, acc = np.empty(len(curve)), None
  for i, v in enumerate(curve):
    acc = v if acc is None else alpha * acc + (1 - alpha) * v
    out[i] = acc
  return out


def plot(out_dir: str, rows: Sequence[Row], mode: str, title: str) -> str:
  """Saves the loss curves PNG (headless, Agg); returns its path.

  train mode: the (smoothed) training loss of every format, the validation loss as a
  marker at the last step. ptq mode: the baseline's training curve, and a bar chart of the
  validation loss per format and what was quantized.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  path = os.path.join(out_dir, PLOT_PNG)
  curved = [r for r in rows if r.curve]
  if mode == "train":
    fig, ax = plt.subplots(figsize=(8, 5))
    _curves(ax, curved)
  else:
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5))
    _curves(ax, curved)
    _bars(bx, rows)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def _curves(ax, rows: Sequence[Row]) -> None:
  colors = [f"C{i}" for i in range(10)]
  lows = []
  for i, r in enumerate(rows):
    c = colors[i % len(colors)]
    steps = np.arange(1, len(r.curve) + 1)
    alpha = 0.9 if len(r.curve) > 50 else 0.0
    smooth = _smooth(r.curve, alpha)
    ax.plot(steps, r.curve, color=c, alpha=0.15, linewidth=0.8)
    ax.plot(steps, smooth, color=c, linewidth=1.6,
            label=f"{r.format}: val {r.val_loss:.3f}")
    ax.plot([steps[-1]], [r.val_loss], marker="o", color=c)
    lows.append(float(np.min(smooth)))
  if lows:
    finite = [v for v in lows if math.isfinite(v)]
    if finite:  # keep the early, steep part of the curves from hiding the differences
      top = max(r.curve[min(len(r.curve) - 1, len(r.curve) // 10)] for r in rows)
      if math.isfinite(top) and top > min(finite):
        ax.set_ylim(min(finite) - 0.05 * (top - min(finite)), top)
  ax.set_xlabel("step")
  ax.set_ylabel("cross entropy (nats / byte)")
  ax.set_title("training loss (smoothed); dots: validation loss")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)


def _bars(ax, rows: Sequence[Row]) -> None:
  base = next((r for r in rows if r.quantized == "-"), None)
  kinds = [k for k in ("weights", "weights+acts") if any(r.quantized == k for r in rows)]
  names = list(dict.fromkeys(r.format for r in rows if r.quantized in kinds))
  width = 0.8 / max(1, len(kinds))
  for j, kind in enumerate(kinds):
    values = {r.format: r.val_loss for r in rows if r.quantized == kind}
    xs = np.arange(len(names)) + (j - (len(kinds) - 1) / 2) * width
    ax.bar(xs, [values.get(n, np.nan) for n in names], width, label=kind, color=f"C{j + 1}")
  if base is not None:
    ax.axhline(base.val_loss, color="C0", linestyle="--", label=f"bf16 {base.val_loss:.3f}")
  finite = [r.val_loss for r in rows if math.isfinite(r.val_loss)]
  if finite:
    lo, hi = min(finite), max(finite)
    ax.set_ylim(lo - 0.5 * (hi - lo + 1e-3), hi + 0.2 * (hi - lo + 1e-3))
  ax.set_xticks(np.arange(len(names)), names, rotation=20)
  ax.set_ylabel("validation cross entropy (nats / byte)")
  ax.set_title("post-training quantization of the bf16 model")
  ax.grid(alpha=0.3, axis="y")
  ax.legend(fontsize=8)
