"""`jax.export` serialization of mxjax's pytree nodes (MXArray, RecipeState,
TensorScaling), so that an exported function taking or returning them serializes
(`Exported.serialize`) like one on plain arrays. Their static fields (str, int, float,
bool, None, dtypes) travel as JSON."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp


def _encode(value):
  if value is None or isinstance(value, (str, int, float, bool)):
    return value
  return {"dtype": jnp.dtype(value).name}


def _decode(value):
  return jnp.dtype(value["dtype"]) if isinstance(value, dict) else value


def register(nodetype: type, name: str) -> None:
  """Registers `nodetype` (already a pytree node) as "mxjax.<name>"."""
  jax.export.register_pytree_node_serialization(
      nodetype, serialized_name=f"mxjax.{name}",
      serialize_auxdata=lambda aux: json.dumps([_encode(v) for v in aux]).encode(),
      deserialize_auxdata=lambda data: tuple(_decode(v) for v in json.loads(data)))
