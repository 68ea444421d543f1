"""Recipe state as data: `init(recipe)` / `update(state, amaxes, recipe)`, like optax.

Each quantized GEMM of a module owns a `RecipeState`: the recipe kind it was made for and,
per tensor role ("input", "kernel", "grad"), a `TensorScaling` (amax history and scale)
when the recipe needs one. Only `DelayedScaling` does; MX block scaling and current
scaling carry no arrays (their `RecipeState` has no leaves).

The modules keep it in the Flax variable collection `STATE_COLLECTION` ("mx_state"), and
advance it in two ways, both computed from the state the step started with:

- `apply(..., mutable=["mx_state"])`: the forward writes the state with the input and
  kernel amaxes recorded (the gradient's amax is not known in the forward). A module whose
  recipe kind changed writes the new recipe's initial state.
- Gradient overwrite (Flax's `OVERWRITE_WITH_GRADIENT` convention, as in
  `flax.linen.fp8_ops`): the gradient of the state variables *is* the next state, all three
  roles advanced. Name the collection `flax.linen.fp8_ops.OVERWRITE_WITH_GRADIENT`
  (`state_collection=` on the modules) and `flax.training.train_state.TrainState` applies
  it; or take `jax.grad` with respect to the state and use `next_state`.

Amax reduction: under plain `jax.jit` with sharded arrays `jnp.max` already sees the
global array, so the amax is global. Inside `shard_map` / `pmap` the amax is local;
with `reduce_amax=True` it is `lax.pmax`-ed over every bound named axis (`reduce_amax`).

A GEMM applied N times in one differentiated loss (micro-batches in a `lax.scan` or a
loop) gets the sum of N next states as its gradient: JAX adds the cotangents of one
input's uses. Each next state counts itself as one use (`TensorScaling.uses`), so the sum
says how many it holds, and every step first reads a state as one use (`settle`). A
`vmap` over the batch with the state shared records each amax's max over the mapped axis
(`batch_amaxes`): one use, as one call on the whole batch.
"""

from mxjax._src.state import (  # noqa: F401  (the public names)
    STATE_COLLECTION, ROLES, HIGH_PRECISION, TensorScaling, RecipeState, init, update, settle,
    next_state, describe, kind_of, fp8_max, scale_from_amax, settle_tensor, update_tensor,
    tensor_amax, reduce_amax)

__all__ = ["STATE_COLLECTION", "ROLES", "HIGH_PRECISION", "TensorScaling", "RecipeState", "init", "update", "settle", "next_state", "describe", "kind_of", "fp8_max", "scale_from_amax", "settle_tensor", "update_tensor", "tensor_amax", "reduce_amax"]
