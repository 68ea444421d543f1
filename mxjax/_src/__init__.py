"""mxjax internals: nothing here is public API; import from mxjax, mxjax.linen, mxjax.nnx,
mxjax.rules and mxjax.state."""
