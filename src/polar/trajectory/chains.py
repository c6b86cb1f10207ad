"""A session's calls as a forest of prompt continuations, cut into chains.

**Which records take part.** Calls are ordered by the session's sequence
number (then attempt), never by wall-clock time. Of each call (``seq``) the
last completed attempt with prompt ids takes part; the others are quarantined
with their reason (:class:`~polar.trajectory.trace.Fate`): a failed attempt's
partial output, an aborted or interrupted call's output never became part of
any conversation, so no later prompt can continue them.

**Parents.** Each call continues at most one earlier call, its parent,
found from prompt tokens alone (:class:`~polar.trajectory.trace.Relation`):
the new prompt holds the parent's whole prompt (``extends``/``closed`` when it
also holds the parent's sampled tokens, else ``rewritten`` or ``retry``), or
the parent's prompt without its generation prompt (``rewritten`` when the
assistant turn is opened again differently, as Qwen3's template does when it
drops a reply's reasoning; ``dropped_turn`` when another turn follows). Among
those the longest match wins (then the better relation, then the later call).
Only when no call qualifies, a prompt that shares a leaf's first two turns
(system prompt and task) and more is ``edited`` from that leaf, or
``restarted`` (a new root) when it is shorter than ``restart_ratio`` of that
leaf's tokens (compaction).

Candidates are the forest's leaves with the new prompt's first turn (system
prompt and tools as rendered) and their ancestors. One comparison against a
leaf bounds how far the new prompt agrees with each ancestor (it cannot agree
with an ancestor further than that ancestor agrees with its child), so finding
a parent costs about the tokens the new prompt shares with the leaves. Prompts
are packed to ``uint32`` bytes once and compared with ``memcmp``: a build costs
one pass over the session's recorded tokens.

**Chains.** A call continues its parent's chain if it is the parent's
*primary* child (the child with the most calls descending from it, then the
better relation, then the later call) and no class rule detached it; any
other child starts a new chain, a fork. A harness that edits a tool output or
rolls history back thus *branches* the conversation at the last call the new
prompt still contains; the longer branch continues the chain. A chain is cut
into **segments** wherever the link between two calls is not clean (relation
other than ``extends``/``closed``, a change of policy version, or a change of
the sampling distribution, :func:`polar.ir.distribution_of`): a segment is
exactly one prompt the engine saw plus what it sampled, under one policy and
one distribution, so it becomes one trace and no token is dropped at a break.

A turn cut at the length limit (no end-of-turn token) that the next prompt
continues with the template's end-of-turn token is ``closed``, not a break:
that token is template glue in the interstitial (loss mask 0), exactly what the
model saw next.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import assert_never

from polar.ir import CompletionRecord, RecordStatus, distribution_of
from polar.ir.tokenids import common_prefix
from polar.ir.tokenids import pack as pack_ids
from polar.trajectory.errors import BuildInputError
from polar.trajectory.trace import BREAKING, BreakReason, Fate, Relation
from polar.trajectory.turns import TurnFormat

CLEAN = frozenset({Relation.EXTENDS, Relation.CLOSED})
_RANK = {
    Relation.EXTENDS: 6,
    Relation.CLOSED: 5,
    Relation.REWRITTEN: 4,
    Relation.RETRY: 3,
    Relation.DROPPED_TURN: 2,
    Relation.EDITED: 1,
    Relation.RESTARTED: 0,
    Relation.FRESH: 0,
}


# ---------------------------------------------------------------- which records take part


def select(
    records: Iterable[CompletionRecord],
) -> tuple[list[CompletionRecord], dict[str, Fate]]:
    """The records that take part, in session order, and the fate of the others."""
    ordered = sorted(records, key=lambda r: (r.seq, r.attempt))
    session_ids = {r.session_id for r in ordered}
    if len(session_ids) > 1:
        raise BuildInputError(f"records of {len(session_ids)} sessions given; build one at a time")
    seen: set[str] = set()
    for r in ordered:
        if r.key in seen:
            raise BuildInputError(f"record {r.key} appears more than once")
        seen.add(r.key)
    last_completed: dict[int, int] = {}
    for r in ordered:
        if r.status is RecordStatus.COMPLETED:
            last_completed[r.seq] = r.attempt
    calls: list[CompletionRecord] = []
    fates: dict[str, Fate] = {}
    for r in ordered:
        match r.status:
            case RecordStatus.FAILED:
                fates[r.key] = Fate.FAILED_CALL
            case RecordStatus.ABORTED:
                fates[r.key] = Fate.ABORTED_CALL
            case RecordStatus.INTERRUPTED:
                fates[r.key] = Fate.INTERRUPTED_CALL
            case RecordStatus.IN_FLIGHT:
                fates[r.key] = Fate.IN_FLIGHT_CALL
            case RecordStatus.COMPLETED if last_completed[r.seq] != r.attempt:
                fates[r.key] = Fate.SUPERSEDED_ATTEMPT
            case RecordStatus.COMPLETED if not r.prompt_ids:
                fates[r.key] = Fate.NO_PROMPT_IDS
            case RecordStatus.COMPLETED:
                calls.append(r)
            case _:
                assert_never(r.status)
    return calls, fates


# ---------------------------------------------------------------- comparing tokens


def pack(ids: Sequence[int]) -> bytes:
    try:
        return pack_ids(ids)
    except OverflowError:
        raise BuildInputError("a token id is negative or wider than 32 bits") from None


def _find(packed: bytes, token: bytes, start: int) -> int | None:
    """Index of the first ``token`` (packed) at or after token ``start``."""
    at = packed.find(token, start * 4)
    while at >= 0 and at % 4:  # a match straddling two tokens
        at = packed.find(token, at + 1)
    return at // 4 if at >= 0 else None


# ---------------------------------------------------------------- parents


@dataclass(frozen=True, slots=True)
class Link:
    """How call ``i`` relates to its parent (``None`` for a root)."""

    relation: Relation
    parent: int | None
    shared: int
    """Tokens shared with the parent's (roots: the closest leaf's) prompt + output."""
    base: int
    """That call's prompt + output length (0 when none was compared)."""
    new_from: int
    """Where this prompt's own tokens begin (after what it continues)."""
    head: Hashable
    """Identity of the prompt's first turn (system prompt and tools, for most
    templates); ``None`` when the prompt has no end-of-turn token."""


Claim = Callable[[int, Link], bool]
"""Whether a class rule claims call ``i`` (given its link)."""


@dataclass(frozen=True, slots=True)
class _Packed:
    prompt: bytes
    output: bytes
    ends_open: bool
    """The sampled tokens do not end with the end-of-turn token (cut short)."""
    head: Hashable
    anchor: int
    """Length of the prompt's first two turns (the system turn and the task)."""
    opener_cut: int | None
    """Prompt length without its generation prompt (``None``: it has none)."""

    def shared_with(self, prompt: bytes) -> int:
        """Tokens ``prompt`` shares with this call's prompt + sampled tokens."""
        shared = common_prefix(prompt, self.prompt)
        if shared * 4 == len(self.prompt):
            tail = prompt[len(self.prompt) : len(self.prompt) + len(self.output)]
            shared += common_prefix(tail, self.output)
        return shared


class _Linker:
    """Finds parents call by call (see the module docstring)."""

    def __init__(self, fmt: TurnFormat, restart_ratio: float, claim: Claim) -> None:
        self.fmt = fmt
        self.claim = claim
        self.claimed: list[bool] = []
        self.eot = pack((fmt.end_of_turn_id,))
        self.restart_ratio = restart_ratio
        self.packed: list[_Packed] = []
        self.links: list[Link] = []
        # First turn -> its leaves, oldest first. Prompts without any end-of-turn
        # token have no first turn (key None) and are compared with every prompt.
        self.leaves: dict[Hashable, dict[int, None]] = {}

    def add(self, call: CompletionRecord) -> Link:
        ids = call.prompt_ids
        me = self._pack(call)
        best: tuple[tuple[int, int, int], Relation, int] | None = None
        closest = (0, -1)  # (shared, leaf) over every leaf compared
        edited = (0, -1)  # (shared, call) the prompt may be an edit of
        pools = [self.leaves.get(me.head, {})]
        if me.head is not None:
            pools.append(self.leaves.get(None, {}))
        for pool in pools:
            for leaf in pool:
                shared = self.packed[leaf].shared_with(me.prompt)
                if shared >= closest[0]:
                    closest = (shared, leaf)
                target = self._unclaimed(leaf)
                if target is not None and shared >= edited[0]:
                    edited = (shared, target)
                node, reach = leaf, shared
                while True:
                    found = self._relation(me.prompt, len(ids), node, reach)
                    if found is not None:
                        relation, matched = found
                        key = (matched, _RANK[relation], node)
                        if best is None or key > best[0]:
                            best = (key, relation, node)
                        if relation is not Relation.DROPPED_TURN:
                            break  # ancestors further up match fewer tokens
                    up = self.links[node]
                    if up.parent is None:
                        break
                    # The new prompt agrees with the parent's tokens as far as it agrees
                    # with this call's and this call's agree with the parent's; where
                    # both stop at once it may go on, so measure.
                    if reach == up.shared:
                        reach = self.packed[up.parent].shared_with(me.prompt)
                    else:
                        reach = min(reach, up.shared)
                    node = up.parent
        if best is not None:
            (matched, _, _), relation, parent = best
            link = Link(
                relation,
                parent,
                self.packed[parent].shared_with(me.prompt),
                self._base(parent),
                matched,
                me.head,
            )
        elif edited[1] >= 0 and edited[0] >= self.packed[edited[1]].anchor:
            shared, target = edited
            base = self._base(target)
            if len(ids) >= self.restart_ratio * base:
                link = Link(Relation.EDITED, target, shared, base, shared, me.head)
            else:
                link = Link(Relation.RESTARTED, None, shared, base, shared, me.head)
        else:
            shared, leaf = closest
            base = self._base(leaf) if leaf >= 0 else 0
            start = self.fmt.head_length(ids)
            link = Link(Relation.FRESH, None, shared, base, start, me.head)
        self.packed.append(me)
        self.links.append(link)
        self.claimed.append(self.claim(len(self.links) - 1, link))
        if link.parent is not None:
            self.leaves.get(self.packed[link.parent].head, {}).pop(link.parent, None)
        self.leaves.setdefault(me.head, {})[len(self.packed) - 1] = None
        return link

    def _unclaimed(self, leaf: int) -> int | None:
        """The call an edit of ``leaf``'s history continues: the leaf, or, when a class
        rule claimed it (a side call forked off a conversation), the nearest
        unclaimed call it continues."""
        node: int | None = leaf
        while node is not None and self.claimed[node]:
            node = self.links[node].parent
        return node

    def _pack(self, call: CompletionRecord) -> _Packed:
        ids = call.prompt_ids
        prompt = pack(ids)
        first = _find(prompt, self.eot, 0)
        head: Hashable = None
        head_length = anchor = len(ids)
        if first is not None:
            head_length = first + 1
            head = (head_length, hash(prompt[: head_length * 4]))
            second = _find(prompt, self.eot, head_length)
            anchor = second + 1 if second is not None else len(ids)
        return _Packed(
            prompt=prompt,
            output=pack(call.output_ids),
            ends_open=bool(call.output_ids) and call.output_ids[-1] != self.fmt.end_of_turn_id,
            head=head,
            anchor=anchor,
            opener_cut=self.fmt.without_generation_prompt(ids),
        )

    def _base(self, i: int) -> int:
        return len(self.packed[i].prompt) // 4 + len(self.packed[i].output) // 4

    def _relation(
        self, prompt: bytes, length: int, node: int, reach: int
    ) -> tuple[Relation, int] | None:
        """``(relation, tokens matched)`` of a prompt against call ``node``, given
        how many leading tokens it shares with that call's prompt + output."""
        c = self.packed[node]
        plen, olen = len(c.prompt) // 4, len(c.output) // 4
        if reach >= plen:
            if prompt[len(c.prompt) : len(c.prompt) + len(c.output)] == c.output:
                end = len(c.prompt) + len(c.output)
                if c.ends_open and length > plen + olen and prompt[end : end + 4] == self.eot:
                    return Relation.CLOSED, plen + olen
                return Relation.EXTENDS, plen + olen
            return (Relation.RETRY if length == plen else Relation.REWRITTEN), plen
        if c.opener_cut is not None and reach >= c.opener_cut:
            # The call's turn opened again, differently (no think block): its reply
            # is there, re-rendered. The header's last token may merge with the
            # re-rendered text (a newline into the reply's leading newlines).
            header = len(self.fmt.assistant_header)
            if header and reach >= c.opener_cut + max(1, header - 1):
                return Relation.REWRITTEN, reach
            return Relation.DROPPED_TURN, c.opener_cut
        return None


def _unclaimed_by_default(index: int, link: Link) -> bool:
    return False


def link_calls(
    calls: Sequence[CompletionRecord],
    fmt: TurnFormat,
    *,
    restart_ratio: float = 0.5,
    claim: Claim = _unclaimed_by_default,
) -> list[Link]:
    """The parent of every call (see the module docstring).

    ``claim(i, link)`` is asked once per call, right after its link is found:
    whether a class rule claims it (then it starts its own chain, and a later
    edited prompt is never taken as an edit of it).
    """
    linker = _Linker(fmt, restart_ratio, claim)
    return [linker.add(call) for call in calls]


# ---------------------------------------------------------------- chains and segments


def form_chains(links: Sequence[Link], detached: Iterable[int] = ()) -> list[list[int]]:
    """Chains of call indices, in order of their first call."""
    n = len(links)
    detached = set(detached)
    size = [1] * n
    for i in range(n - 1, -1, -1):
        parent = links[i].parent
        if parent is not None:
            size[parent] += size[i]
    primary: dict[int, int] = {}
    for i in range(n):
        parent = links[i].parent
        if parent is None or i in detached:
            continue
        current = primary.get(parent)
        if current is None or (size[i], _RANK[links[i].relation], i) > (
            size[current],
            _RANK[links[current].relation],
            current,
        ):
            primary[parent] = i
    chains: list[list[int]] = []
    chain_of = [0] * n
    for i in range(n):
        parent = links[i].parent
        if parent is not None and primary.get(parent) == i:
            chain_of[i] = chain_of[parent]
            chains[chain_of[i]].append(i)
        else:
            chain_of[i] = len(chains)
            chains.append([i])
    return chains


def segments(
    chain: Sequence[int], links: Sequence[Link], calls: Sequence[CompletionRecord]
) -> list[tuple[BreakReason | None, list[int]]]:
    """A chain cut where two calls do not continue cleanly; each piece with why it began."""
    out: list[tuple[BreakReason | None, list[int]]] = [(None, [chain[0]])]
    for previous, i in pairwise(chain):
        relation = links[i].relation
        if relation not in CLEAN:
            out.append((BREAKING.get(relation, BreakReason.EDITED), [i]))
        elif calls[i].policy_version != calls[previous].policy_version:
            out.append((BreakReason.POLICY_CHANGED, [i]))
        elif distribution_of(calls[i].behaviour) != distribution_of(calls[previous].behaviour):
            out.append((BreakReason.SAMPLING_CHANGED, [i]))
        else:
            out[-1][1].append(i)
    return out


def logprobs_of(record: CompletionRecord) -> tuple[list[float], list[int]]:
    """The record's logprobs, one per sampled token, and which of them are real."""
    n = len(record.output_ids)
    values = list(record.output_logprobs[:n])
    if len(values) == n and all(map(math.isfinite, values)):
        return values, [1] * n
    mask = [1 if math.isfinite(v) else 0 for v in values] + [0] * (n - len(values))
    values = [v if ok else 0.0 for v, ok in zip(values, mask, strict=False)] + [0.0] * (
        n - len(values)
    )
    return values, mask
