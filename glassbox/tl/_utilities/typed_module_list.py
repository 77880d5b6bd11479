"""``transformer_lens.utilities.typed_module_list``: ``TypedModuleList[T]``, an ``nn.ModuleList`` that
type checkers read as holding ``T`` (``TypedModuleList[Attention]``); at run time exactly a ModuleList."""

from typing import Generic, TypeVar

from torch import nn

T = TypeVar("T", bound=nn.Module)


class TypedModuleList(nn.ModuleList, Generic[T]):
    """``nn.ModuleList`` with an element type parameter (indexing, slicing and append as ModuleList's)."""


__all__ = ["TypedModuleList"]
