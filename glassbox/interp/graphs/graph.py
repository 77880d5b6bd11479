"""AttributionGraph: the direct effects between the nodes of one prompt's local replacement model.

Nodes, in this order (circuit-tracer's): the active features (layer, pos, feature), sorted by layer,
then position, then feature; the error nodes, layer-major (layer 0 at every position, then layer 1,
...), n_layers x n_pos of them; the token embeddings, one per position; the logit nodes, the top
tokens at the last position (largest probability first). ``adjacency[target, source]`` is the direct
effect of the source on the target through the frozen linear model: for a feature target, on its
pre-activation (its encoder's affine map of its input); for a logit target, on the logit minus the
mean logit over the vocabulary. Sources' effects scale with their values: a feature's column is its
activation times its decoder's effect, an error's is the whole residual's, a token's its embedding's.

``values`` holds each target's value in the clean run (pre-activation; demeaned logit; 0 for error and
token nodes, which have no inputs); ``constants`` = values - adjacency.sum(1), the part no node
explains (biases, positional embeddings, the MLP outputs at excluded positions), which the tests
compute independently as the target's value with every node source zeroed.

Edges never run backwards: a feature at layer l receives only from features and errors at layers
< l, and nothing at position p receives from positions > p (tested). Error and token rows are zero.
"""

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor


@dataclass
class AttributionGraph:
    tokens: Tensor  # [pos] long
    active_features: Tensor  # [n_features 3] long: layer, pos, feature
    activation_values: Tensor  # [n_features]
    logit_tokens: Tensor  # [n_logits] long
    logit_probabilities: Tensor  # [n_logits]
    adjacency: Tensor  # [n_nodes n_nodes], rows targets, columns sources
    values: Tensor  # [n_nodes]
    n_layers: int
    exclude_positions: int = 1
    meta: dict = field(default_factory=dict)

    @property
    def n_pos(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.active_features.shape[0])

    @property
    def n_logits(self) -> int:
        return int(self.logit_tokens.shape[0])

    @property
    def n_nodes(self) -> int:
        return self.n_features + (self.n_layers + 1) * self.n_pos + self.n_logits

    @property
    def error_start(self) -> int:
        return self.n_features

    @property
    def token_start(self) -> int:
        return self.n_features + self.n_layers * self.n_pos

    @property
    def logit_start(self) -> int:
        return self.token_start + self.n_pos

    def error_index(self, layer: int, pos: int) -> int:
        return self.error_start + layer * self.n_pos + pos

    def token_index(self, pos: int) -> int:
        return self.token_start + pos

    def logit_index(self, i: int) -> int:
        return self.logit_start + i

    def feature_index(self, layer: int, pos: int, feature: int) -> int:
        """The node index of an active feature; a KeyError if it is not a node."""
        hit = ((self.active_features == torch.tensor([layer, pos, feature])).all(1)).nonzero()
        if len(hit) == 0:
            raise KeyError(f"feature {feature} at layer {layer}, position {pos} is not an active feature node")
        return int(hit[0, 0])

    @property
    def constants(self) -> Tensor:
        """Each target's value not explained by any node: values - the sum of its incoming edges."""
        return self.values - self.adjacency.sum(1)

    def node_kind(self, i: int) -> str:
        if not 0 <= i < self.n_nodes:
            raise IndexError(f"node {i} is outside [0, {self.n_nodes})")
        if i < self.error_start:
            return "feature"
        if i < self.token_start:
            return "error"
        return "token" if i < self.logit_start else "logit"

    def node_layer_pos(self, i: int) -> tuple:
        """(layer, pos) of node i: tokens at layer -1 ("embedding"), logits at layer n_layers, last position."""
        kind = self.node_kind(i)
        if kind == "feature":
            layer, pos, _ = self.active_features[i].tolist()
            return layer, pos
        if kind == "error":
            return divmod(i - self.error_start, self.n_pos)
        if kind == "token":
            return -1, i - self.token_start
        return self.n_layers, self.n_pos - 1

    def node_layers_positions(self) -> tuple:
        """[n_nodes] layer and position of every node (as ``node_layer_pos``)."""
        L, P = self.n_layers, self.n_pos
        err_l = torch.arange(L).repeat_interleave(P)
        err_p = torch.arange(P).repeat(L)
        layers = torch.cat([self.active_features[:, 0], err_l, torch.full((P,), -1), torch.full((self.n_logits,), L)])
        positions = torch.cat([self.active_features[:, 1], err_p, torch.arange(P),
                               torch.full((self.n_logits,), P - 1)])
        return layers, positions

    def __repr__(self) -> str:
        return (f"AttributionGraph({self.n_features} features, {self.n_layers}x{self.n_pos} errors, {self.n_pos} "
                f"tokens, {self.n_logits} logits; {int((self.adjacency != 0).sum())} nonzero edges)")
