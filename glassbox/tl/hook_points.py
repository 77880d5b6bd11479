"""TransformerLens's ``hook_points``: glassbox's HookPoint and HookedRootModule under their names."""

from typing import Callable, Optional, Sequence, Union

from ..hooks import HookedRootModule, HookHandle, HookIntrospectionMixin, HookPoint

LensHandle = HookHandle  # what add_hook returns: ``handle.remove()`` detaches that one registration
NamesFilter = Optional[Union[Callable[[str], bool], Sequence[str], str]]

__all__ = ["HookIntrospectionMixin", "HookPoint", "HookedRootModule", "LensHandle", "NamesFilter"]
