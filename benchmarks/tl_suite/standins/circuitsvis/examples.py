from ._view import View


def hello(name: str) -> View:
    return View("hello", name=name)
