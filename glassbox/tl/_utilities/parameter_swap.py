"""``transformer_lens.utilities.parameter_swap``: ``temporarily_swap_parameter(parameter, new_value)``,
glassbox's ``models.param_swap.swapped_parameter`` (values copied in, restored on exit, even on error)."""

from ...models.param_swap import swapped_parameter as temporarily_swap_parameter

__all__ = ["temporarily_swap_parameter"]
