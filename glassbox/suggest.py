""""Did you mean": the valid names closest to a mistyped one, for error messages.

Imports nothing of glassbox (nor torch), so every layer and the command line's parsers use it. The
closeness is ``difflib.get_close_matches`` (ratio of matching characters >= 0.6 by default), and at
most 3 names are offered, best first; a name that is close to nothing gets no hint, never a guess.
"""

import difflib
from typing import Iterable

MAX_SUGGESTIONS = 3


def close_names(name, valid: Iterable, n: int = MAX_SUGGESTIONS, cutoff: float = 0.6) -> list:
    """Up to ``n`` names of ``valid`` closest to ``name``, best first ([] when none is close, or when
    ``name`` is not a string). Matching ignores case, and the names come back as ``valid`` spells them."""
    if not isinstance(name, str):
        return []
    spelled = {}
    for v in valid:
        if isinstance(v, str):
            spelled.setdefault(v.lower(), v)
    return [spelled[m] for m in difflib.get_close_matches(name.lower(), list(spelled), n=n, cutoff=cutoff)]


def did_you_mean(name, valid: Iterable, n: int = MAX_SUGGESTIONS, cutoff: float = 0.6) -> str:
    """``"; did you mean 'a', 'b' or 'c'?"`` for the names of ``valid`` closest to ``name``, or "" when
    none is close: append it to the message that names ``name``."""
    close = close_names(name, valid, n, cutoff)
    if not close:
        return ""
    quoted = [repr(c) for c in close]
    listed = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
    return f"; did you mean {listed}?"
