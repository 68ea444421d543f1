"""The bf16 baseline's checkpoint (orbax), reused by `--mode ptq` when it still fits.

Layout under the output directory, one checkpoint per seed:

  bf16_checkpoint/seed_S/params/   orbax StandardCheckpointer tree of the float32 params
  bf16_checkpoint/seed_S/meta.json what made them (`key`: model shape, data, training) and
                                   the training curve and timing
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

DIRNAME = "bf16_checkpoint"


def directory(out_dir: str, seed: int) -> str:
  """The checkpoint directory of `seed`'s bf16 model."""
  return os.path.join(os.path.abspath(out_dir), DIRNAME, f"seed_{seed}")


def _paths(out_dir: str, seed: int) -> tuple[str, str]:
  root = directory(out_dir, seed)
  return os.path.join(root, "params"), os.path.join(root, "meta.json")


def save(out_dir: str, seed: int, params, key: dict[str, Any], extra: dict[str, Any]) -> str:
  """Writes `params` and `{"key": key, **extra}`; returns the checkpoint directory.

  `key` must be JSON-serializable: a later `load` with another key ignores the checkpoint.
  """
  params_dir, meta_path = _paths(out_dir, seed)
  if os.path.exists(meta_path):
    os.remove(meta_path)  # never leave a meta that describes other params
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(params_dir, params, force=True)
  checkpointer.wait_until_finished()
  checkpointer.close()
  with open(meta_path, "w") as f:
    json.dump({"key": key, **extra}, f, indent=1)
  return os.path.dirname(params_dir)


def load(out_dir: str, seed: int, key: dict[str, Any], like_params):
  """The saved params and meta if a checkpoint made with `key` is there, else None.

  Args:
    out_dir: the sweep's output directory.
    seed: the seed whose model is wanted.
    key: what the params must have been made with (compared as JSON).
    like_params: a params tree of the expected structure, shapes and dtypes.

  Returns:
    (params, meta dict) or None (nothing saved, another key, or unreadable).
  """
  params_dir, meta_path = _paths(out_dir, seed)
  if not (os.path.isfile(meta_path) and os.path.isdir(params_dir)):
    return None
  try:
    with open(meta_path) as f:
      meta = json.load(f)
  except (OSError, ValueError):
    return None
  if meta.get("key") != json.loads(json.dumps(key)):
    return None
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, like_params)
  checkpointer = ocp.StandardCheckpointer()
  try:
    params = checkpointer.restore(params_dir, target)
  except (ValueError, KeyError, FileNotFoundError):
    return None
  finally:
    checkpointer.close()
  return params, meta

