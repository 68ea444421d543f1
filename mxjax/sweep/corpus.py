"""The sweep's text corpus: the Python standard library's own `.py` sources as raw bytes
(nothing to download), a seeded selection of files split by file into train / validation.
"""

from __future__ import annotations

import dataclasses
import os
import sysconfig
from typing import Iterator

import numpy as np

#: Directories under the stdlib that hold other people's code, not the stdlib's.
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
#: Bytes between concatenated files (a form feed line: files do not run into each other).
SEPARATOR = b"\n\x0c\n"


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Train / validation bytes of a file-level split.

  Attributes:
    train, val: uint8[n] concatenated file contents (files joined by `SEPARATOR`).
    train_files, val_files: the files in each split, relative to `root`, in corpus order.
    root: the directory the files were read from.
  """

  train: np.ndarray
  val: np.ndarray
  train_files: tuple[str, ...]
  val_files: tuple[str, ...]
  root: str

  def summary(self) -> str:
    return (f"{len(self.train_files)} train files ({self.train.size / 1e6:.2f} MB), "
            f"{len(self.val_files)} val files ({self.val.size / 1e6:.2f} MB) from {self.root}")


def stdlib_root() -> str:
  """The directory of the running interpreter's standard library."""
  return sysconfig.get_paths()["stdlib"]


def source_files(root: str) -> list[str]:
  """All `.py` files under `root` (relative paths, sorted), skipping site-packages."""
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
    rel = os.path.relpath(dirpath, root)
    files.extend(os.path.normpath(os.path.join(rel, f)) for f in filenames if f.endswith(".py"))
  return sorted(files)


def load(max_files: int = 256, val_fraction: float = 0.1, seed: int = 0,
         root: str | None = None) -> Corpus:
  """Reads a seeded selection of `max_files` stdlib sources and splits it by file (the same
  bytes for the same `seed` and directory listing).

  Args:
    max_files: how many files to draw (all of them if fewer exist).
    val_fraction: the share of drawn files held out for validation (at least one file).
    seed: the selection's seed.
    root: the source directory; default `stdlib_root()`.
  """
  root = root or stdlib_root()
  files = source_files(root)
  if len(files) < 2:
    raise FileNotFoundError(f"need at least 2 .py files under {root}, found {len(files)}")
  order = np.random.default_rng(seed).permutation(len(files))
  chosen = [files[i] for i in order[:max(2, min(max_files, len(files)))]]
  n_val = min(len(chosen) - 1, max(1, round(len(chosen) * val_fraction)))
  val_files, train_files = tuple(chosen[:n_val]), tuple(chosen[n_val:])
  return Corpus(_read(root, train_files), _read(root, val_files), train_files, val_files,
                root)


def _read(root: str, files) -> np.ndarray:
  parts = []
  for f in files:
    with open(os.path.join(root, f), "rb") as fh:
      parts.append(fh.read())
  return np.frombuffer(SEPARATOR.join(parts), dtype=np.uint8).copy()


def train_batches(tokens: np.ndarray, batch_size: int, seq_len: int,
                  seed: int = 0) -> Iterator[np.ndarray]:
  """Endless random windows of `tokens`, the same sequence for the same seed.

  Yields:
    int32[batch_size, seq_len + 1]: inputs are `[:, :-1]`, targets `[:, 1:]`.
  """
  _check_length(tokens, seq_len)
  rng = np.random.default_rng(seed)
  span = np.arange(seq_len + 1)
  while True:
    starts = rng.integers(0, tokens.size - seq_len, size=batch_size)
    yield tokens[starts[:, None] + span].astype(np.int32)


def eval_batches(tokens: np.ndarray, batch_size: int, seq_len: int,
                 num_batches: int) -> list[np.ndarray]:
  """`num_batches` int32[batch_size, seq_len + 1] windows spread evenly over `tokens`."""
  _check_length(tokens, seq_len)
  count = batch_size * num_batches
  starts = np.linspace(0, tokens.size - seq_len - 1, count).astype(np.int64)
  windows = tokens[starts[:, None] + np.arange(seq_len + 1)].astype(np.int32)
  return list(windows.reshape(num_batches, batch_size, seq_len + 1))


def _check_length(tokens: np.ndarray, seq_len: int) -> None:
  if tokens.size < seq_len + 2:
    raise ValueError(f"a split of {tokens.size} bytes is too short for seq_len {seq_len}; "
                     "raise --max-samples")
