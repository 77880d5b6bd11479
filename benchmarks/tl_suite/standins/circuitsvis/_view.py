import html


class View:
    def __init__(self, view: str, /, **facts):  # positional-only: a view's facts may include ``name``
        self.view, self.facts = view, facts

    def _repr_html_(self) -> str:
        facts = ", ".join(f"{k}={v}" for k, v in self.facts.items())
        return f"<div>circuitsvis stand-in: {html.escape(self.view)} ({html.escape(facts)})</div>"

    def show_code(self) -> str:
        return self._repr_html_()
