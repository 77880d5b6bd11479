"""Hook points and the hook-managing base class of every hooked model."""

from .hook_point import HookFn, HookHandle, HookPoint, NoLayerError, Registration
from .root import HookedRootModule, HookIntrospectionMixin, unknown_name_message
from .splice import Splice
from .threads import HookStateGuard

__all__ = ["HookFn", "HookHandle", "HookIntrospectionMixin", "HookPoint", "HookStateGuard", "HookedRootModule",
           "NoLayerError", "Registration", "Splice", "unknown_name_message"]
