"""as_transformer_lens(): make ``import transformer_lens`` (and its submodules) give glassbox.tl.

Every module of the glassbox.tl package is imported and entered in ``sys.modules`` under its
TransformerLens dotted name (``glassbox.tl.hook_points`` -> ``transformer_lens.hook_points``), so
``from transformer_lens.hook_points import HookPoint`` works too. The package is walked, so modules
added later are included. Refused, saying so, when a real ``transformer_lens`` is already imported
(its objects would mix with glassbox's); calling it again is a no-op.

Footgun: the registration is process-wide. Anything importing ``transformer_lens`` afterwards gets
glassbox.tl, including libraries that expected the real package.
"""

import importlib
import pkgutil
import sys

ALIAS = "transformer_lens"


def _submodules(package) -> list:
    names = [package.__name__]
    for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + "."):
        if info.name.rsplit(".", 1)[-1].startswith("_"):
            continue
        names.append(info.name)
    return names


def as_transformer_lens():
    """Register glassbox.tl as ``transformer_lens`` in ``sys.modules``; returns the glassbox.tl package."""
    import glassbox.tl as package

    present = sys.modules.get(ALIAS)
    if present is package:
        return package
    if present is not None:
        where = getattr(present, "__file__", None) or repr(present)
        raise RuntimeError(f"transformer_lens is already imported (from {where}), so glassbox.tl cannot take its "
                           "name: call glassbox.tl.as_transformer_lens() before anything imports transformer_lens, "
                           "or use the real package")
    real = [name for name in sys.modules if name.startswith(ALIAS + ".")]
    if real:
        raise RuntimeError(f"modules of a real transformer_lens are already imported ({', '.join(sorted(real)[:3])}"
                           "...): glassbox.tl cannot take its name")
    modules = {name: importlib.import_module(name) for name in _submodules(package)}
    for name, module in modules.items():
        sys.modules[ALIAS + name[len(package.__name__):]] = module
    # TransformerLens 3.x's own modules import its helpers as transformer_lens.utilities.
    sys.modules[ALIAS + ".utilities"] = package.utils
    return package
