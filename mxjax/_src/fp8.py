"""Per-tensor-scaled FP8 `dot_general` (DelayedScaling, Float8CurrentScaling): the one
product (`mxjax._src.product`) with `TensorRoles`.

Each operand is `q = cast_fp8(clip(x * scale))` (`codec.quantize_per_tensor`) and the
product `(q_lhs . q_rhs) / (scale_lhs * scale_rhs)`. DelayedScaling takes scales from the
recipe state (while a role has an amax recorded) and returns the next state as that
state's gradient (gradient overwrite); Float8CurrentScaling takes each scale from the
tensor's own amax.
"""

from __future__ import annotations

from typing import Mapping

from mxjax._src import dot, operands
from mxjax._src import state as state_lib
from mxjax._src.recipes import Recipe
from mxjax._src.roles import TensorRoles


def dot_general(lhs, rhs, dimension_numbers, recipe: Recipe,
                tensors: Mapping[str, state_lib.TensorScaling] | None = None, *,
                preferred_element_type=None, out_sharding=None):
  """Per-tensor FP8 `lax.dot_general` of `lhs` (the "input") and `rhs` (the "kernel").

  Args:
    lhs, rhs: bf16 / f16 / f32 arrays.
    dimension_numbers: as in `lax.dot_general`.
    recipe: DelayedScaling or Float8CurrentScaling.
    tensors: DelayedScaling only: role -> TensorScaling (`RecipeState.tensors`); its
      gradient is the next state (all roles advanced).
    preferred_element_type: output dtype; default the operands' result type.
    out_sharding: the output's sharding under Explicit mesh axes.

  Returns:
    (out, {"input": f32[], "kernel": f32[]} amaxes, not differentiable).
  """
  if not recipe.fp8():
    raise ValueError(f"mxjax._src.fp8.dot_general needs a per-tensor FP8 recipe, got {recipe}")
  if not (operands.is_array(lhs) and operands.is_array(rhs)):
    raise TypeError("per-tensor FP8 quantizes each operand with this step's scale: its "
                    "operands are arrays, not MXArrays (those hold block-scaled formats)")
  if recipe.delayed() and not tensors:
    raise ValueError("DelayedScaling needs the recipe state's tensors (mxjax.state.init)")
  config = dot.make_config(lhs, rhs, dimension_numbers, TensorRoles(recipe),
                           preferred_element_type, out_sharding,
                           recipe_name=type(recipe).__name__)
  return dot.run(config, lhs, rhs, dimension_numbers,
                 tensors=dict(tensors) if recipe.delayed() else None)
