"""The model's SAE methods, SAELens's ``HookedSAETransformer`` names: each calls
``glassbox.interp.sae.splice`` (where the contract is stated)."""

from typing import Iterable, Optional, Sequence


class SAEMethods:
    def add_sae(self, sae, use_error_term: Optional[bool] = None) -> None:
        """Splice ``sae`` in at its hook (a transcoder at its two hooks); see ``glassbox.interp.sae.splice``."""
        from ..interp.sae.splice import add_sae

        add_sae(self, sae, use_error_term=use_error_term)

    def reset_saes(self, act_names: Optional[Iterable[str]] = None) -> None:
        """Remove the SAEs writing at ``act_names``, or all of them."""
        from ..interp.sae.splice import reset_saes

        reset_saes(self, act_names)

    @property
    def acts_to_saes(self) -> dict:
        """The spliced SAEs by the hook where each writes."""
        from ..interp.sae.splice import acts_to_saes

        return acts_to_saes(self)

    def saes(self, saes: Sequence = (), reset_saes_end: bool = True, use_error_term: Optional[bool] = None):
        """Context manager: ``with model.saes([sae]): ...`` splices for the block, then restores."""
        from ..interp.sae.splice import with_saes

        return with_saes(self, saes, reset_saes_end, use_error_term)

    def run_with_saes(self, *args, **kwargs):
        from ..interp.sae.splice import run_with_saes

        return run_with_saes(self, *args, **kwargs)

    def run_with_cache_with_saes(self, *args, **kwargs):
        from ..interp.sae.splice import run_with_cache_with_saes

        return run_with_cache_with_saes(self, *args, **kwargs)

    def run_with_hooks_with_saes(self, *args, **kwargs):
        from ..interp.sae.splice import run_with_hooks_with_saes

        return run_with_hooks_with_saes(self, *args, **kwargs)
