from ._view import View


def _check(tokens, attention, name):
    import numpy as np

    pattern = np.asarray(attention.detach().cpu() if hasattr(attention, "detach") else attention)
    if pattern.ndim != 3 or pattern.shape[1] != pattern.shape[2] or pattern.shape[1] != len(tokens):
        raise ValueError(f"{name}: attention must be [head dest src] with dest = src = len(tokens)={len(tokens)}, "
                         f"got {pattern.shape}")
    return pattern


def attention_patterns(tokens, attention, **kwargs) -> View:
    pattern = _check(tokens, attention, "attention_patterns")
    return View("attention_patterns", heads=pattern.shape[0], tokens=len(tokens))


def attention_heads(attention, tokens, **kwargs) -> View:
    pattern = _check(tokens, attention, "attention_heads")
    return View("attention_heads", heads=pattern.shape[0], tokens=len(tokens))
