"""`jax.export` serialization of mxjax's pytree nodes (MXArray, RecipeState, TensorScaling);
their static fields travel as JSON."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp

from mxjax._src.formats import BlockFormat


def _encode(value):
  if value is None or isinstance(value, (str, int, float, bool)):
    return value
  if isinstance(value, BlockFormat):
    return {"block_format": [value.element, value.scale.value, list(value.block),
                             value.tensor_scale, value.scale_mode]}
  return {"dtype": jnp.dtype(value).name}


def _decode(value):
  if not isinstance(value, dict):
    return value
  if "block_format" in value:
    element, scale, block, tensor_scale, mode = value["block_format"]
    return BlockFormat(element, scale, tuple(block), tensor_scale, mode)
  return jnp.dtype(value["dtype"])


def register(nodetype: type, name: str) -> None:
  """Registers `nodetype` (already a pytree node) as "mxjax.<name>"."""
  jax.export.register_pytree_node_serialization(
      nodetype, serialized_name=f"mxjax.{name}",
      serialize_auxdata=lambda aux: json.dumps([_encode(v) for v in aux]).encode(),
      deserialize_auxdata=lambda data: tuple(_decode(v) for v in json.loads(data)))
