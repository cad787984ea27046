"""Tree rounds: verify a tree of drafts in one target pass and keep its longest agreeing path.

A chain of k drafts is lost at its first miss; a tree also offers the drafter's runner-up guesses
(`width` candidates per depth), so a miss on the favourite can still be kept through a sibling. The
target reads every node in one pass (kernels/fused_layer.py: row m at position offset + depth(m),
seeing the cache, its ancestors and itself, with the bits of a one-row step), greedy acceptance
picks the deepest node whose whole path agrees (verify.tree_greedy_accept), and the KV cache keeps
that path only, moved into place. Greedy output is token-identical to plain decoding; sampling and
anything that reads the drafts as one history (repeat penalty, grammars) keep the chain round.

    strategy = tree_round(width)          # a Decoder's `speculative` factory
"""

from __future__ import annotations

from functools import partial

import mlx.core as mx
import mlx.nn as nn

from .cache import new_cache, rewind
from .features import head, tapped
from .kernels.fused_layer import fused, tree_ready
from .kernels.row_positions import tree_passes_ready
from .kernels.tree_mask import TreeMask, tree_rows
from .options import GenerateOptions
from .rounds import Outcome, PlanNext, Verifier
from .step_graph import StepGraphs
from .verify import tree_greedy_accept

MAX_TREE_NODES = 63  # drafts per tree (+ the root: one bit each in the kernel's 64-bit row masks)


def tree_forward(model: nn.Module, x: mx.array, cache: list, parents: list[int], hidden: bool | tuple[int, ...],
                 steps: StepGraphs | None = None):
    """(N,) ids of a tree's nodes -> (logits (N, V), final hidden states (N, H) or None; with `hidden` a
    tuple, the inputs of those layers: features.target_forward). mlx-lm's decoder body with a TreeMask in
    place of the causal mask: the CPU's fused blocks place and mask each row themselves; on a GPU mlx-lm's
    blocks see the rows' positions as their caches' offset (TreePositions: RoPE per row, through
    kernels/row_positions.py) and the attention kernel takes the mask, through `steps`' compiled graphs
    where they apply (as the one-row steps the rows must equal run), else built eagerly."""
    if fused(model):
        return _tree_body(model, x, cache, TreeMask(tuple(parents)), hidden)
    start = cache[0].offset
    positions = mx.array([start + d for d in depths(parents)], dtype=mx.int32)
    rows = tree_rows(tuple(parents), start)
    if steps is not None:
        name = "tree" if not hidden else "tree-hidden" if hidden is True else f"tree-hidden:{','.join(map(str, hidden))}"
        steps.extra.setdefault(name, partial(_tree_graph, model, hidden))
        out = steps.replay(name, (x, positions, rows), cache)
        if out is not None:
            return out[0], (out[1] if hidden else None)
    return _tree_body(model, x, [TreePositions(c, positions) for c in cache], TreeMask(tuple(parents), rows), hidden)


def _tree_graph(model: nn.Module, hidden, inputs: tuple, views: list) -> list[mx.array]:
    """A GPU tree pass as a compiled graph's function: the tree (tree_rows) and positions are its inputs."""
    x, positions, rows = inputs
    logits, h = _tree_body(model, x, [TreePositions(v, positions) for v in views], TreeMask((), rows), hidden)
    return [logits] + ([h] if hidden else [])


def _tree_body(model: nn.Module, x: mx.array, cache: list, mask: TreeMask, hidden: bool | tuple[int, ...]):
    body = model.model
    h = body.embed_tokens(x[None])
    for layer, c in zip(body.layers, cache):
        h = layer(h, mask, cache=c)
    h = body.norm(h)
    if isinstance(hidden, tuple):
        return head(model)(h)[0], tapped(model, hidden)[0]
    return head(model)(h)[0], (h[0] if hidden else None)


def path_to(parents: list[int], node: int) -> list[int]:
    """The nodes from the root (0) down to `node`."""
    return TreeMask(tuple(parents)).path(node)


def depths(parents: list[int]) -> list[int]:
    """Each node's depth (the root's 0)."""
    depth = [0] * len(parents)
    for m in range(1, len(parents)):
        depth[m] = depth[parents[m]] + 1
    return depth


def tree_depth(parents: list[int]) -> int:
    return max(depths(parents))


class TreePositions:
    """A layer's KV cache in a tree pass through mlx-lm's blocks: `offset` is the rows' positions (N,) for
    RoPE; the nodes' keys and values go into the cache itself, in row order, as a chain's would."""

    def __init__(self, cache, positions: mx.array):
        self.cache, self.offset = cache, positions

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        return self.cache.update_and_fetch(keys, values)

    def __getattr__(self, name: str):
        return getattr(self.cache, name)


def keep_path(cache: list, start: int, path: list[int]) -> None:
    """The cache held the tree's nodes at [start, start + N): keep the path's, in order, at start."""
    if path != list(range(len(path))):  # a sibling was kept: move its entries into place
        idx = mx.array([start + p for p in path], dtype=mx.int32)
        end = start + len(path)
        for c in cache:
            c.keys[..., start:end, :] = c.keys[..., idx, :]
            c.values[..., start:end, :] = c.values[..., idx, :]
    rewind(cache, cache[0].offset - start - len(path))


def tree_refusal(target: nn.Module, drafter, opts: GenerateOptions, constraint, width: int,
                 takes_trees: bool | None = None) -> str | None:
    """Why tree rounds do not apply, or None where they do: width > 1, a drafter that drafts trees, greedy, no repeat
    penalty or grammar (they read the drafts as one history), no logprobs (chains report them), and a target that takes
    tree passes (`takes_trees`: the engine's answer from load time; None: ask target_takes_trees now)."""
    reasons = ((width <= 1, "a width of 1"), (not drafter.trees, f"the {drafter.name} drafter drafts chains"),
               (not opts.greedy, "sampling (trees verify greedy decoding)"), (constraint is not None, "structured output"),
               (opts.logprobs is not None, "logprobs (chains report them)"),
               (opts.repeat_penalty != 1.0 and opts.repeat_last_n != 0, "a repeat penalty"))
    for applies, reason in reasons:
        if applies:
            return reason
    if not (target_takes_trees(target) if takes_trees is None else takes_trees):
        return "this model's passes take no trees on this device (its blocks have no tree path, or the kernels are off)"
    return None


def target_takes_trees(target: nn.Module) -> bool:
    """Can tree passes run on this target at all (on the CPU every block fused; on a GPU llama-family blocks
    on the attention kernel: kernels/row_positions.py)? Where they cannot, no round builds a pass eagerly
    and the engine's exactness check needs only the passes decoding runs."""
    inner = getattr(target, "model", None)  # wrapped models (Gemma 4's language_model) have no tree path
    if inner is None or not hasattr(inner, "embed_tokens"):
        return False
    caches, dtype = new_cache(target), inner.embed_tokens(mx.array([0])).dtype
    return tree_ready(target, dtype, caches[0]) or tree_passes_ready(target, caches, dtype)


def tree_sizes(depth: int, width: int) -> tuple[int, ...]:
    """The nodes (root included) of the trees rounds of up to `depth` at `width` verify (Draft.favourites_tree:
    `width` candidates per depth); none for a chain's width."""
    return tuple(1 + min(d * width, MAX_TREE_NODES) for d in range(1, depth + 1)) if width > 1 else ()


def chain_pass(model: nn.Module, steps: StepGraphs | None = None):
    """A tree pass over a chain: (1, M) ids, cache -> logits (1, M, V), as a tree round builds its passes
    (the engine's exactness check holds them to one-row steps: exactness.RowInvariance)."""
    def forward(x: mx.array, cache: list) -> mx.array:
        return tree_forward(model, x[0], cache, [-1] + list(range(x.shape[1] - 1)), False, steps)[0][None]
    return forward


class TreeRound:
    """k > 0: draft a tree of depth k (up to `width` candidates per depth), verify every node in one pass."""

    def __init__(self, v: Verifier, width: int):
        self.v, self.width = v, width

    def run(self, cache: list, context: list[int], k: int, plan_next: PlanNext) -> Outcome:
        v, drafter, stats = self.v, self.v.drafter, self.v.stats
        drafter_syncs = drafter.syncs
        draft = drafter.propose(context, k, v.sampling, None, width=self.width)
        stats.host_syncs += drafter.syncs - drafter_syncs
        parents = [-1] + (draft.parents or list(range(draft.count)))  # (N,): a chain when no tree came
        x = mx.concatenate([mx.array(context[-1:], dtype=mx.uint32), draft.tokens])  # (N,)
        start = cache[0].offset
        logits, hidden = tree_forward(v.target, x, cache, parents, drafter.wants_features, v.steps)  # (N, V)
        node, nxt = tree_greedy_accept(logits, draft.tokens, parents)
        mx.eval(node, nxt, draft.tokens)  # the round's one host synchronisation
        stats.host_syncs += 1
        path = path_to(parents, int(node.item()))
        keep_path(cache, start, path)
        n, drafts = len(path) - 1, draft.tokens.tolist()
        if hidden is None:
            drafter.accept(n)
        else:  # the path's rows: the last context token and the kept drafts
            drafter.accept(n, hidden=hidden[mx.array(path, dtype=mx.int32)])
        depth = tree_depth(parents)
        stats.record_round(depth, n)  # counted by depth: drafted positions, as a chain of `depth`
        stats.tree_rounds += 1
        return Outcome([drafts[m - 1] for m in path[1:]] + [int(nxt.item())], n, depth)

    def settle(self, cache: list, extra: int) -> None:
        rewind(cache, extra)  # (trees run over KV caches alone)

    def drop(self, cache: list) -> None:
        """Nothing is queued past a tree round."""


def tree_round(width: int):
    """A Decoder `speculative` factory: TreeRound of this width."""
    return lambda v: TreeRound(v, width)
