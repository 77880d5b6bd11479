"""PatchResult: a sweep's values with named axes and per-axis labels, ready to plot.

``values`` is an ordinary tensor (on the model's device) whose axes are named by ``axes`` from the
project's vocabulary (``layer pos head query_pos key_pos``, plus ``component`` for stacked sweeps
and ``batch`` when a sweep keeps one value per prompt). ``labels[axis]`` holds one string per index:
layer numbers, head numbers, or the string tokens of the first prompt for position axes. Labels may
repeat (a token can occur twice); plots keep repeated labels apart by plotting by index.
"""

from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class PatchResult:
    values: Tensor
    axes: tuple
    labels: dict = field(default_factory=dict)
    name: str = ""
    metric: str = ""

    def __post_init__(self):
        if len(self.axes) != self.values.ndim:
            raise ValueError(f"PatchResult has {self.values.ndim} axes of values but names {self.axes}")
        for axis, size in zip(self.axes, self.values.shape):
            if axis in self.labels and len(self.labels[axis]) != size:
                raise ValueError(f"axis {axis!r} has {size} entries but {len(self.labels[axis])} labels")

    @property
    def shape(self) -> tuple:
        return tuple(self.values.shape)

    def cpu(self) -> "PatchResult":
        return PatchResult(self.values.cpu(), self.axes, dict(self.labels), self.name, self.metric)

    def select(self, axis: str, index: int) -> "PatchResult":
        """The result at one index of ``axis`` (e.g. one component of a stacked sweep)."""
        if axis not in self.axes:
            raise KeyError(f"axis {axis!r} is not one of {self.axes}")
        dim = self.axes.index(axis)
        labels = {a: l for a, l in self.labels.items() if a != axis}
        name = self.labels[axis][index] if axis in self.labels else f"{self.name}[{index}]"
        return PatchResult(self.values.select(dim, index), self.axes[:dim] + self.axes[dim + 1:], labels,
                           name, self.metric)

    def __repr__(self) -> str:
        dims = ", ".join(f"{a}={n}" for a, n in zip(self.axes, self.values.shape))
        return f"PatchResult({self.name or 'sweep'}: {dims}; metric={self.metric or '?'})"

    def _repr_html_(self) -> str:  # the notebook view: a heatmap table in plain HTML (no script)
        from ..reprs import patch_html

        return patch_html(self)
