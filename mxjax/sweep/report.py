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
class Run:
  """One seed of a row.

  Attributes:
    seed: the init / data-order seed.
    val_loss: mean validation cross entropy, nats per byte.
    step_ms: median train step (train mode) or eval batch (ptq mode) time, ms.
    train_loss, curve: final training loss (None if not trained here), per-step losses.
    delta_pct: val loss vs the baseline's of the same seed, percent (`add_deltas`).
  """

  seed: int
  val_loss: float
  step_ms: float
  train_loss: float | None = None
  curve: list[float] = dataclasses.field(default_factory=list)
  delta_pct: float | None = None


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
  """(mean, sample standard deviation); the std is None for fewer than two values."""
  a = np.asarray(values, np.float64)
  return float(np.mean(a)), (float(np.std(a, ddof=1)) if a.size > 1 else None)


@dataclasses.dataclass
class Row:
  """One line of the table: a format and what was quantized, over one or more seeds.

  Attributes:
    format: the canonical sweep format name (e.g. "mxfp8_e4m3").
    quantized: "-" (baseline), "fwd+bwd" (QAT), "weights" or "weights+acts" (PTQ).
    bytes_per_param, given: storage of one weight (bf16: 2); the name the user typed.
    runs: one Run per seed.
  """

  format: str
  quantized: str
  bytes_per_param: float
  given: str | None = None
  runs: list[Run] = dataclasses.field(default_factory=list)

  @property
  def val_loss(self) -> float:
    return mean_std([r.val_loss for r in self.runs])[0]

  @property
  def val_loss_std(self) -> float | None:
    return mean_std([r.val_loss for r in self.runs])[1]

  @property
  def train_loss(self) -> float | None:
    losses = [r.train_loss for r in self.runs if r.train_loss is not None]
    return mean_std(losses)[0] if losses else None

  @property
  def step_ms(self) -> float:
    return float(np.median([r.step_ms for r in self.runs]))

  @property
  def perplexity(self) -> float:
    return math.exp(self.val_loss) if math.isfinite(self.val_loss) else float("nan")

  @property
  def curve(self) -> list[float]:
    """The mean training curve over the seeds (empty for PTQ rows)."""
    curves = [r.curve for r in self.runs if r.curve]
    return np.mean(np.asarray(curves), axis=0).tolist() if curves else []

  @property
  def delta_pct(self) -> float | None:
    deltas = [r.delta_pct for r in self.runs if r.delta_pct is not None]
    return mean_std(deltas)[0] if deltas else None

  @property
  def delta_pct_std(self) -> float | None:
    deltas = [r.delta_pct for r in self.runs if r.delta_pct is not None]
    return mean_std(deltas)[1] if deltas else None

  @property
  def delta_pct_se(self) -> float | None:
    """Standard error of the mean Δ: std / sqrt(seeds)."""
    std = self.delta_pct_std
    return None if std is None else std / math.sqrt(len(self.runs))

  @property
  def significant(self) -> bool | None:
    """Whether the mean Δ exceeds 2 standard errors (None: baseline, or one seed)."""
    se = self.delta_pct_se
    if se is None or self.quantized == "-":
      return None
    return abs(self.delta_pct) > 2 * se

  def summary(self) -> dict[str, Any]:
    """The row as JSON-ready data: the means, spreads, significance and every run."""
    fields = ("format", "given", "quantized", "bytes_per_param", "train_loss", "val_loss",
              "val_loss_std", "perplexity", "delta_pct", "delta_pct_std", "delta_pct_se",
              "significant", "step_ms", "curve")
    return dict({f: getattr(self, f) for f in fields},
                runs=[dataclasses.asdict(r) for r in self.runs])


def add_deltas(rows: Sequence[Row], baseline: Row) -> None:
  """Sets each run's `delta_pct`: its validation loss vs the baseline's of the same seed, %."""
  base = {r.seed: r.val_loss for r in baseline.runs}
  for row in rows:
    for r in row.runs:
      r.delta_pct = 100.0 * (r.val_loss - base[r.seed]) / base[r.seed]


def _fmt(value, spec: str) -> str:
  if value is None:
    return "-"
  if isinstance(value, float) and not math.isfinite(value):
    return "nan"
  return format(value, spec)


def _spread(mean, std, spec: str, unit: str = "") -> str:
  text = _fmt(mean, spec) + (unit if mean is not None else "")
  return text if std is None else f"{text} ± {_fmt(std, spec.lstrip('+'))}{unit}"


def table(rows: Sequence[Row], mode: str) -> str:
  """The results as an aligned Markdown table (several seeds: mean ± std, Δ > 2 SE)."""
  seeds = max(len(r.runs) for r in rows)
  time_header = "step ms" if mode == "train" else "eval ms"
  header = ["format", "quantized", "train loss", "val loss", "ppl", "Δ val loss"]
  header += ["Δ > 2 SE"] if seeds > 1 else []
  header += [time_header, "bytes/param"]
  lines = []
  for r in rows:
    line = [r.format, r.quantized, _fmt(r.train_loss, ".4f"),
            _spread(r.val_loss, r.val_loss_std, ".4f"), _fmt(r.perplexity, ".3f"),
            _spread(r.delta_pct, r.delta_pct_std, "+.2f", "%")]
    if seeds > 1:
      line.append({None: "-", True: "yes", False: "no"}[r.significant])
    lines.append(line + [_fmt(r.step_ms, ".1f"), _fmt(r.bytes_per_param, ".4f")])
  widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
  left = {0, 1}

  def render(cells):
    return "| " + " | ".join(c.ljust(w) if i in left else c.rjust(w)
                             for i, (c, w) in enumerate(zip(cells, widths))) + " |"

  rule = "|" + "|".join(("-" * (w + 1) + ":") if i not in left else ("-" * (w + 2))
                        for i, w in enumerate(widths)) + "|"
  return "\n".join([render(header), rule] + [render(line) for line in lines])


def write_json(out_dir: str, rows: Sequence[Row], meta: dict[str, Any]) -> str:
  """Writes `results.json` (meta + rows) atomically; returns its path."""
  path = os.path.join(out_dir, RESULTS_JSON)
  data = dict(meta)
  data["rows"] = [r.summary() for r in rows]
  tmp = path + ".tmp"
  try:
    with open(tmp, "w") as f:
      json.dump(data, f, indent=1, default=_json_default, allow_nan=True)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
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

  train mode: the smoothed training losses, each minus bf16's (same seed and step, in %,
  symlog where one is far), and Δ validation loss per row (±2 SE over seeds). ptq mode:
  the baseline's curve and the validation loss per format and what was quantized.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  path = os.path.join(out_dir, PLOT_PNG)
  curved = [r for r in rows if r.curve]
  names = list(dict.fromkeys(r.format for r in rows if r.quantized != "-"))
  colors = {name: f"C{i % 10}" for i, name in enumerate(names)}
  colors.update({r.format: "black" for r in rows if r.quantized == "-"})
  if mode == "train":
    fig, (ax, dx, bx) = plt.subplots(1, 3, figsize=(17, 5.2), width_ratios=(5, 5, 4))
    _curves(ax, curved, colors)
    _differences(dx, curved, colors)
    _deltas(bx, [r for r in rows if r.quantized != "-"], colors)
  else:
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5))
    _curves(ax, curved, colors)
    _bars(bx, rows)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def _alpha(steps: int) -> float:
  """The smoothing factor of the curves' moving average (none for short runs)."""
  return 0.9 if steps > 50 else 0.0


def _seeds(rows: Sequence[Row]) -> int:
  return max((len(r.runs) for r in rows), default=1)


def _curves(ax, rows: Sequence[Row], colors: dict | None = None) -> None:
  colors = colors or {}
  lows, highs = [], []
  for i, r in enumerate(rows):
    c = colors.get(r.format, f"C{i % 10}")
    curve = r.curve
    steps = np.arange(1, len(curve) + 1)
    alpha = _alpha(len(curve))
    smooth = _smooth(curve, alpha)
    per_seed = np.asarray([_smooth(run.curve, alpha) for run in r.runs if run.curve])
    if len(per_seed) > 1:
      ax.fill_between(steps, per_seed.min(0), per_seed.max(0), color=c, alpha=0.2,
                      linewidth=0)
    std = r.val_loss_std
    label = f"{r.format}: val {r.val_loss:.3f}" + (f" ± {std:.3f}" if std is not None else "")
    ax.plot(steps, smooth, color=c, linewidth=1.4, label=label)
    ax.plot([steps[-1]], [r.val_loss], "o", color=c, markersize=5)
    tail = smooth[len(smooth) // 10:]
    lows.append(float(np.min(tail)))
    highs.append(float(np.max(tail)))
  finite = [(lo, hi) for lo, hi in zip(lows, highs) if math.isfinite(lo) and math.isfinite(hi)]
  if finite:  # from the end of the steep start: the whole of every smoothed curve after it
    lo, hi = min(v[0] for v in finite), max(v[1] for v in finite)
    vals = [r.val_loss for r in rows if math.isfinite(r.val_loss)]
    lo, hi = min([lo, *vals]), max([hi, *vals])
    pad = 0.04 * (hi - lo + 1e-6)
    ax.set_ylim(lo - pad, hi + pad)
  seeds = _seeds(rows)
  ax.set_xlabel("step")
  ax.set_ylabel("cross entropy (nats / byte)")
  ax.set_title("training loss, moving average" + (f" (mean of {seeds} seeds;\nband: min-max)"
                                                  if seeds > 1 else "")
               + "; dot: validation loss", fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)


def _differences(ax, rows: Sequence[Row], colors: dict) -> None:
  """Each format's smoothed training loss minus the baseline's, same seed and step, in %."""
  base = next((r for r in rows if r.quantized == "-"), None)
  if base is None:
    return
  base_runs = {run.seed: run.curve for run in base.runs if run.curve}
  peak, top, bottom = 0.0, 0.0, 0.0
  for r in rows:
    if r is base:
      continue
    diffs = []
    for run in r.runs:
      b = base_runs.get(run.seed)
      if run.curve and b and len(b) == len(run.curve):
        alpha = _alpha(len(b))
        sb = _smooth(b, alpha)
        diffs.append(100.0 * (_smooth(run.curve, alpha) - sb) / sb)
    if not diffs:
      continue
    diffs = np.asarray(diffs)
    steps = np.arange(1, diffs.shape[1] + 1)
    c = colors.get(r.format, "C1")
    if len(diffs) > 1:
      ax.fill_between(steps, diffs.min(0), diffs.max(0), color=c, alpha=0.2, linewidth=0)
    mean = diffs.mean(0)
    ax.plot(steps, mean, color=c, linewidth=1.4, label=r.format)
    tail = mean[len(mean) // 10:]
    if tail.size and np.all(np.isfinite(tail)):
      peak = max(peak, float(np.max(np.abs(tail))))
      top, bottom = max(top, float(np.max(diffs))), min(bottom, float(np.min(diffs)))
  ax.axhline(0.0, color="black", linewidth=1, label=f"{base.format} (zero)")
  if peak > 2.0:  # one far row (MXFP4 round-to-nearest) must not flatten the close ones
    from matplotlib import ticker
    ax.set_yscale("symlog", linthresh=1.0, linscale=2.0)
    marks = [v for v in (-50, -20, -10, -5, -2, -1, -0.5, 0, 0.5, 1, 2, 5, 10, 20, 50, 100)
             if abs(v) <= 1 or bottom <= v <= top]
    ax.yaxis.set_major_locator(ticker.FixedLocator(marks))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:+g}" if v else "0"))
    ax.yaxis.set_minor_locator(ticker.NullLocator())
  ax.set_xlabel("step")
  ax.set_ylabel(f"training loss − {base.format}'s, same step (%)")
  notes = (["band: seeds' min-max"] if _seeds(rows) > 1 else []) + (
      ["symlog axis, linear within ±1%"] if peak > 2.0 else [])
  ax.set_title(f"training loss minus {base.format}'s, moving averages"
               + (f"\n({'; '.join(notes)})" if notes else ""), fontsize=9)
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=8)


def _deltas(ax, rows: Sequence[Row], colors: dict | None = None) -> None:
  """Horizontal bars of Δ validation loss, each value written past its bar."""
  colors = colors or {}
  ys = np.arange(len(rows))[::-1]
  means = np.array([r.delta_pct if r.delta_pct is not None else np.nan for r in rows])
  seeds = _seeds(rows)
  whiskers = [2 * (r.delta_pct_se or 0.0) for r in rows]
  cs = [colors.get(r.format, f"C{(i + 1) % 10}") for i, r in enumerate(rows)]
  ax.barh(ys, means, 0.6, xerr=whiskers if seeds > 1 and any(whiskers) else None, capsize=4,
          color=cs, alpha=0.6)
  finite = means[np.isfinite(means)]
  span = float(np.max(np.abs(finite))) if finite.size else 1.0
  for y, r, c, m in zip(ys, rows, cs, means):
    if seeds > 1:
      ax.plot([run.delta_pct for run in r.runs if run.delta_pct is not None],
              [y] * len([run for run in r.runs if run.delta_pct is not None]), "o", color=c,
              markersize=4)
    if not math.isfinite(m):
      continue
    reach = max(abs(m) + 2 * (r.delta_pct_se or 0.0), 0.0) if seeds > 1 else abs(m)
    mark = " *" if r.significant else ""
    ax.annotate(f"{m:+.2f}%{mark}", (math.copysign(reach, m) if m else 0.0, y),
                textcoords="offset points", xytext=(5 if m >= 0 else -5, 0),
                ha="left" if m >= 0 else "right", va="center", fontsize=8)
  ax.axvline(0.0, color="black", linewidth=1)
  ax.set_yticks(ys, [r.format for r in rows])
  lo = min(0.0, float(np.min(finite)) if finite.size else 0.0)
  ax.set_xlim(lo - 0.3 * span if lo < 0 else -0.02 * span, 1.3 * span if span else 1.0)
  ax.set_xlabel("Δ validation loss vs bf16 (%)")
  if seeds > 1:
    ax.set_title(f"Δ validation loss: mean of {seeds} seeds (bar),\n±2 SE (whiskers), seeds "
                 "(dots); * beyond 2 SE", fontsize=9)
  else:
    ax.set_title("Δ validation loss, one seed (no error bars: --seeds N gives them;\n"
                 "at this size ~0.1-0.2% is seed noise)", fontsize=9)
  ax.grid(alpha=0.3, axis="x")


def _bars(ax, rows: Sequence[Row]) -> None:
  base = next((r for r in rows if r.quantized == "-"), None)
  kinds = [k for k in ("weights", "weights+acts") if any(r.quantized == k for r in rows)]
  names = list(dict.fromkeys(r.format for r in rows if r.quantized in kinds))
  width = 0.8 / max(1, len(kinds))
  for j, kind in enumerate(kinds):
    by_name = {r.format: r for r in rows if r.quantized == kind}
    xs = np.arange(len(names)) + (j - (len(kinds) - 1) / 2) * width
    values = [by_name[n].val_loss if n in by_name else np.nan for n in names]
    errors = [(by_name[n].val_loss_std or 0.0) if n in by_name else 0.0 for n in names]
    ax.bar(xs, values, width, yerr=errors if any(errors) else None, capsize=3, label=kind,
           color=f"C{j + 1}")
  if base is not None:
    ax.axhline(base.val_loss, color="C0", linestyle="--", label=f"bf16 {base.val_loss:.3f}")
    if base.val_loss_std:
      ax.axhspan(base.val_loss - base.val_loss_std, base.val_loss + base.val_loss_std,
                 color="C0", alpha=0.15)
  finite = [r.val_loss for r in rows if math.isfinite(r.val_loss)]
  if finite:
    lo, hi = min(finite), max(finite)
    ax.set_ylim(lo - 0.5 * (hi - lo + 1e-3), hi + 0.2 * (hi - lo + 1e-3))
  ax.set_xticks(np.arange(len(names)), names, rotation=20)
  ax.set_ylabel("validation cross entropy (nats / byte)")
  ax.set_title("post-training quantization of the bf16 model")
  ax.grid(alpha=0.3, axis="y")
  ax.legend(fontsize=8)
