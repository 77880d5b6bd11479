import html


class View:
    def __init__(self, name: str, **facts):
        self.name, self.facts = name, facts

    def _repr_html_(self) -> str:
        facts = ", ".join(f"{k}={v}" for k, v in self.facts.items())
        return f"<div>circuitsvis stand-in: {html.escape(self.name)} ({html.escape(facts)})</div>"

    def show_code(self) -> str:
        return self._repr_html_()
