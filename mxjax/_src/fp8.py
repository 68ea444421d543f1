"""Per-tensor-scaled FP8 `dot_general` (DelayedScaling, Float8CurrentScaling), in jnp.

`q = cast_fp8(clip(x * scale, -fp8_max, fp8_max))`; the product is
`(q_lhs . q_rhs) / (scale_lhs * scale_rhs)`, FP8 values widened exactly to f32. DelayedScaling
takes scales from the recipe state (while a role has an amax recorded) and returns the next
state as that state's gradient (gradient overwrite); Float8CurrentScaling takes each scale
from the tensor's own amax.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from jax import lax

from mxjax._src import state as state_lib
from mxjax._src import formats, products
from mxjax._src.ops import no_derivative
from mxjax._src.recipes import Recipe

_FP8_DTYPES = {"e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2}


def quantize_per_tensor(x, scale, format: str = "e4m3") -> jax.Array:
  """`x * scale` (f32) saturated to ±max and cast to FP8 (float8_e4m3fn / float8_e5m2)."""
  fmt = formats.element_format(format)
  if fmt.name not in _FP8_DTYPES:
    raise ValueError(f"per-tensor FP8 needs e4m3 or e5m2, got {fmt.name}")
  scaled = jnp.asarray(x).astype(jnp.float32) * jnp.asarray(scale, jnp.float32)
  return jnp.clip(scaled, -fmt.max, fmt.max).astype(_FP8_DTYPES[fmt.name])


def dequantize_per_tensor(q, scale, dtype=jnp.float32) -> jax.Array:
  """`q / scale` in `dtype`."""
  return (q.astype(jnp.float32) / jnp.asarray(scale, jnp.float32)).astype(dtype)


@dataclasses.dataclass(frozen=True)
class _Config:
  dimension_numbers: Any
  recipe: Recipe
  out_dtype: Any
  lhs_dtype: Any
  rhs_dtype: Any
  out_sharding: Any = None


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
  if recipe.delayed() and not tensors:
    raise ValueError("DelayedScaling needs the recipe state's tensors (mxjax.state.init)")
  out_dtype = jnp.dtype(preferred_element_type or jnp.result_type(lhs.dtype, rhs.dtype))
  tensors = dict(tensors) if recipe.delayed() else None
  config = _Config(dimension_numbers, recipe, out_dtype, jnp.dtype(lhs.dtype),
                   jnp.dtype(rhs.dtype), out_sharding)
  with products.marked("dot_general", lhs.shape, rhs.shape,
                       products.dot_flops(lhs.shape, rhs.shape, dimension_numbers), str(recipe)):
    return _fp8_dot(config, lhs, rhs, tensors)


def _scale(x, config: _Config, tensors, role: str):
  """(scale, amax) for one tensor: from the state (delayed, once an amax is recorded) or
  from x's amax."""
  amax = state_lib.tensor_amax(x, config.recipe)
  current = state_lib.scale_from_amax(amax, config.recipe, role)
  if tensors is None:
    return current, amax
  recorded = jnp.any(tensors[role].amax_history > 0)
  return jnp.where(recorded, tensors[role].scale, current), amax


def _dot_f32(a, b, config: _Config):
  return lax.dot_general(a.astype(jnp.float32), b.astype(jnp.float32), config.dimension_numbers,
                         precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32,
                         out_sharding=config.out_sharding)


def _settled(config: _Config, tensors):
  """The DelayedScaling tensors as one use (`mxjax.state.settle`); None stays None."""
  if tensors is None:
    return None
  return {role: state_lib.settle_tensor(t, config.recipe, role) for role, t in tensors.items()}


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fp8_dot(config: _Config, lhs, rhs, tensors):
  return _forward(config, lhs, rhs, _settled(config, tensors))[0]


def _forward(config: _Config, lhs, rhs, tensors):
  recipe = config.recipe
  s_in, a_in = _scale(lhs, config, tensors, "input")
  s_k, a_k = _scale(rhs, config, tensors, "kernel")
  q_in = quantize_per_tensor(lhs, s_in, recipe.fwd_format)
  q_k = quantize_per_tensor(rhs, s_k, recipe.fwd_format)
  out = _dot_f32(q_in, q_k, config) / (s_in * s_k)
  amaxes = {"input": lax.stop_gradient(a_in), "kernel": lax.stop_gradient(a_k)}
  return (out.astype(config.out_dtype), amaxes), (q_in, q_k, s_in, s_k, amaxes)


def _fp8_dot_fwd(config, lhs, rhs, tensors):
  tensors = _settled(config, tensors)
  out, (q_in, q_k, s_in, s_k, amaxes) = _forward(config, lhs, rhs, tensors)
  return out, (q_in, q_k, s_in, s_k, amaxes, tensors)


# The cotangent: differentiating the backward (jax.hessian) raises, never an all-NaN result.
_once = no_derivative(lambda g: g, "mxjax's per-tensor FP8 product's gradient")


def _fp8_dot_bwd(config: _Config, residuals, cotangents):
  q_in, q_k, s_in, s_k, amaxes, tensors = residuals
  g, _ = cotangents  # the amaxes output is not differentiable
  g = _once(g)
  s_g, a_g = _scale(g, config, tensors, "grad")
  q_g = quantize_per_tensor(g, s_g, config.recipe.bwd_format)
  # The VJP of a dot is a pair of dots: run them on the FP8 values (widened exactly).
  _, vjp = jax.vjp(lambda a, b: _dot_f32(a, b, config),
                   q_in.astype(jnp.float32), q_k.astype(jnp.float32))
  d_in, d_k = vjp(q_g.astype(jnp.float32))
  d_in = (d_in / (s_g * s_k)).astype(config.lhs_dtype)
  d_k = (d_k / (s_g * s_in)).astype(config.rhs_dtype)
  next_tensors = None
  if tensors is not None:
    state = state_lib.RecipeState(tensors=tensors, kind=state_lib.kind_of(config.recipe))
    recorded = state_lib.update(
        state, state_lib.batch_amaxes({**amaxes, "grad": a_g}, state), config.recipe)
    next_tensors = dict(recorded.tensors)
  return d_in, d_k, next_tensors


_fp8_dot.defvjp(_fp8_dot_fwd, _fp8_dot_bwd)
