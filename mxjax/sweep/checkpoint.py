"""The bf16 baseline's checkpoint (orbax), reused by `--mode ptq` when it still fits:
`bf16_checkpoint/seed_S/params/` (the f32 params) and `.../meta.json` (`key`: what made
them, plus the training curve and timing)."""

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
  """Writes `params` and `{"key": key, **extra}` (JSON); returns the checkpoint directory."""
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
  """(params, meta) if a readable checkpoint made with `key` (compared as JSON) is there,
  else None; `like_params`: a tree of the expected structure, shapes and dtypes."""
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

