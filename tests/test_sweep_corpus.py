"""The sweep's corpus: the stdlib's .py files, a deterministic file-level split, batches."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest

from mxjax.sweep import corpus


@pytest.fixture(scope="module")
def small():
  return corpus.load(max_files=24, seed=3)


def test_reads_the_stdlib_sources(small):
  root = corpus.stdlib_root()
  assert small.root == root and os.path.isfile(os.path.join(root, "os.py"))
  for f in small.train_files + small.val_files:
    assert f.endswith(".py") and "site-packages" not in f.split(os.sep)
    assert os.path.isfile(os.path.join(root, f))
  assert small.train.dtype == np.uint8 and small.val.dtype == np.uint8
  assert small.train.size > 1000 and small.val.size > 0
  assert b"def " in small.train.tobytes() or b"import " in small.train.tobytes()


def test_split_is_by_file_and_disjoint(small):
  assert len(small.train_files) + len(small.val_files) == 24
  assert not set(small.train_files) & set(small.val_files)
  assert len(small.val_files) == round(24 * 0.1)
  with open(os.path.join(small.root, small.val_files[0]), "rb") as f:
    first = f.read()
  assert small.val.tobytes().startswith(first)


def test_deterministic_across_calls(small):
  again = corpus.load(max_files=24, seed=3)
  assert again.train_files == small.train_files and again.val_files == small.val_files
  np.testing.assert_array_equal(again.train, small.train)
  np.testing.assert_array_equal(again.val, small.val)
  other = corpus.load(max_files=24, seed=4)
  assert other.train_files != small.train_files


def test_no_network(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("the corpus must not touch the network")

  monkeypatch.setattr(socket, "socket", refuse)
  monkeypatch.setattr(socket, "create_connection", refuse)
  monkeypatch.setattr(socket, "getaddrinfo", refuse)
  data = corpus.load(max_files=8, seed=0)
  assert data.train.size > 0 and data.val.size > 0


def test_custom_root_skips_site_packages(tmp_path):
  for name in ("a.py", "b.py", "c.py", "notes.txt", "pkg/d.py", "site-packages/e.py"):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {name}\nx = 1\n")
  assert corpus.source_files(str(tmp_path)) == ["a.py", "b.py", "c.py", os.path.join("pkg", "d.py")]
  data = corpus.load(max_files=100, seed=0, root=str(tmp_path))
  assert len(data.train_files) == 3 and len(data.val_files) == 1
  with pytest.raises(FileNotFoundError):
    corpus.load(root=str(tmp_path / "pkg"))


def test_train_batches_deterministic_and_shifted(small):
  a = corpus.train_batches(small.train, 4, 16, seed=1)
  b = corpus.train_batches(small.train, 4, 16, seed=1)
  for _ in range(3):
    x, y = next(a), next(b)
    assert x.shape == (4, 17) and x.dtype == np.int32
    np.testing.assert_array_equal(x, y)
    assert x.min() >= 0 and x.max() < 256
  c = corpus.train_batches(small.train, 4, 16, seed=2)
  assert not np.array_equal(next(c), next(corpus.train_batches(small.train, 4, 16, seed=1)))


def test_eval_batches_fixed_windows(small):
  batches = corpus.eval_batches(small.val, 2, 8, 3)
  assert len(batches) == 3 and all(b.shape == (2, 9) for b in batches)
  again = corpus.eval_batches(small.val, 2, 8, 3)
  for x, y in zip(batches, again):
    np.testing.assert_array_equal(x, y)
  text = small.val.tobytes()
  for row in np.concatenate(batches):
    assert bytes(row.astype(np.uint8)) in text
  with pytest.raises(ValueError, match="too short"):
    corpus.eval_batches(small.val[:5], 1, 8, 1)
