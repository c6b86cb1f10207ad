"""Append-only prompts: splice the raw sampled ids of earlier turns back in.

A harness resends the whole conversation on every call, and what it resends
is not what the model produced: it re-serializes tool-call arguments, drops
reasoning, trims whitespace, and the chat template may rewrite earlier turns.
Rendering that text again gives a prompt that is not a token extension of the
previous one, so the model is trained on a context it never saw.

The gateway keeps, per session, the recent calls it served (messages, prompt
ids, sampled ids, the assistant message it returned). When a request's
messages extend one of them (its messages, then an assistant turn that is the
one the gateway produced), the new prompt is that call's prompt, its sampled
ids, and the template's rendering of only the new messages after that turn. If
no earlier call is extended the prompt is rendered from scratch and its
relation to the session's calls is measured and recorded (:func:`lineage_of`).
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from polar.ir import (
    JsonObject,
    Message,
    PromptLineage,
    PromptOrigin,
    Role,
    TextPart,
    ToolSpec,
)
from polar.ir.tokenids import TokenRun, best_shared_prefix, common_prefix, pack, unpack
from polar.proxy.render.template import ChatTemplate
from polar.proxy.render.tokenbound import TooManyTokens


@dataclass(frozen=True, slots=True)
class PastCall:
    """A completed call of the session, as a base for later prompts. Its ids
    are packed, sharing their prefix with the call they continue."""

    seq: int
    attempt: int
    messages: tuple[Message, ...]
    prompt: TokenRun
    full: TokenRun
    """The prompt, then the sampled ids."""
    output: Message

    @staticmethod
    def of(
        seq: int,
        attempt: int,
        messages: tuple[Message, ...],
        prompt_ids: Sequence[int] | bytes,
        output_ids: Sequence[int] | bytes,
        output: Message,
        *,
        on: PastCall | None = None,
    ) -> PastCall:
        """Pack a call's ids (stored as a delta on ``on``'s when given: exact
        whatever ``on`` is, cheapest when the prompt continues it)."""
        packed = prompt_ids if isinstance(prompt_ids, bytes) else pack(prompt_ids)
        prompt = TokenRun.of(packed, on.full if on is not None else None)
        sampled = output_ids if isinstance(output_ids, bytes) else pack(output_ids)
        if on is not None:
            messages = _shared_messages(messages, on.messages)
        return PastCall(seq, attempt, messages, prompt, prompt.then(sampled), output)

    @property
    def tokens(self) -> int:
        return len(self.full)

    @property
    def own_bytes(self) -> int:
        """Bytes this call's ids add to those of the call it continues."""
        sampled = self.full.own_bytes() if self.full is not self.prompt else 0
        return self.prompt.own_bytes() + sampled


def _shared_messages(
    messages: tuple[Message, ...], earlier: tuple[Message, ...]
) -> tuple[Message, ...]:
    """``messages`` with each leading one equal to ``earlier``'s replaced by that
    object: a resent conversation is held once per session, not once per call."""
    n = 0
    for sent, known in zip(messages, earlier, strict=False):
        if sent is not known and sent != known:
            break
        n += 1
    return earlier[:n] + messages[n:] if n else messages


@dataclass(slots=True, eq=False)
class Transcript:
    """The recent calls of one session (newest last)."""

    calls: deque[PastCall] = field(default_factory=lambda: deque(maxlen=16))
    charged: int = 0
    """Bytes of packed ids added for this session (an upper bound on what it holds)."""
    owner: Transcripts | None = field(default=None, repr=False)

    def add(self, call: PastCall) -> None:
        self.calls.append(call)
        self.charged += call.own_bytes
        if self.owner is not None:
            self.owner.charge(self, call.own_bytes)

    def find(self, seq: int | None, attempt: int | None) -> PastCall | None:
        for call in reversed(self.calls):
            if call.seq == seq and call.attempt == attempt:
                return call
        return None


class Transcripts:
    """Transcripts of the sessions the gateway is serving.

    A session's transcript is dropped when the session closes; all of them
    together are bounded by ``budget_bytes`` of packed ids, the least recently
    used session dropped first (it loses splicing, not records: its next
    prompt is rendered afresh and its lineage recorded as such).
    """

    def __init__(self, budget_bytes: int = 1 << 30) -> None:
        self._budget = budget_bytes
        self._bytes = 0
        self._by_session: OrderedDict[str, Transcript] = OrderedDict()

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._by_session)

    def get(self, session_id: str) -> Transcript:
        transcript = self._by_session.get(session_id)
        if transcript is None:
            transcript = self._by_session[session_id] = Transcript(owner=self)
        else:
            self._by_session.move_to_end(session_id)
        return transcript

    def charge(self, transcript: Transcript, n: int) -> None:
        """Count ``n`` more bytes for ``transcript``; drop others past the budget."""
        self._bytes += n
        while self._bytes > self._budget and self._by_session:
            session_id, oldest = next(iter(self._by_session.items()))
            if oldest is transcript:
                if len(self._by_session) == 1:
                    return  # one session over the whole budget keeps its own
                self._by_session.move_to_end(session_id)
                continue
            self.drop(session_id)

    def drop(self, session_id: str) -> None:
        transcript = self._by_session.pop(session_id, None)
        if transcript is not None:
            transcript.owner = None
            self._bytes -= transcript.charged


# ---------------------------------------------------------------- matching turns


def _canonical_arguments(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments.strip()


def _text(message: Message) -> str:
    return "\n".join(p.text for p in message.parts if isinstance(p, TextPart)).strip()


def _role(message: Message) -> Role:
    return Role.SYSTEM if message.role is Role.DEVELOPER else message.role


def same_turn(sent: Message, known: Message) -> bool:
    """Whether a resent message is the same turn as a known one.

    Tolerates what harnesses change when they resend: whitespace around text,
    tool-call arguments re-serialized, reasoning dropped, text parts versus a
    string, ``developer`` versus ``system``. Tool-call ids are not compared
    (some harnesses mint their own); names and arguments are.
    """
    if sent == known:
        return True
    if _role(sent) is not _role(known) or _text(sent) != _text(known):
        return False
    if sent.tool_call_id != known.tool_call_id:
        return False
    a, b = sent.tool_calls, known.tool_calls
    if len(a) != len(b):
        return False
    return all(
        x.name == y.name and _canonical_arguments(x.arguments) == _canonical_arguments(y.arguments)
        for x, y in zip(a, b, strict=True)
    )


def extended_call(messages: Sequence[Message], transcript: Transcript) -> PastCall | None:
    """The latest call whose conversation ``messages`` extends: its messages, then
    the assistant turn it produced. Longest such conversation wins."""
    best: PastCall | None = None
    for call in reversed(transcript.calls):
        n = len(call.messages)
        if len(messages) <= n or (best is not None and n <= len(best.messages)):
            continue
        if messages[n].role is not Role.ASSISTANT or not same_turn(messages[n], call.output):
            continue
        if all(same_turn(messages[i], call.messages[i]) for i in range(n)):
            best = call
    return best


def lineage_of(
    prompt_ids: Sequence[int] | bytes, messages: Sequence[Message], transcript: Transcript
) -> PromptLineage:
    """How a prompt relates to the session's earlier calls (any capture mode)."""
    prompt = prompt_ids if isinstance(prompt_ids, bytes) else pack(prompt_ids)
    return _lineage(prompt, extended_call(messages, transcript), transcript)


def _lineage(prompt: bytes, base: PastCall | None, transcript: Transcript) -> PromptLineage:
    """:func:`lineage_of`, the extended call (``base``) already looked up."""
    if base is not None:
        full = base.full.packed()
        shared = common_prefix(prompt, full)
        return PromptLineage(
            origin=PromptOrigin.EXTENDS if shared == len(base.full) else PromptOrigin.REWRITTEN,
            base_seq=base.seq,
            base_attempt=base.attempt,
            shared_tokens=shared,
            base_tokens=len(base.full),
        )
    # The call sharing the longest prefix, the latest of those that tie.
    found = best_shared_prefix(prompt, transcript.calls, lambda call: call.full)
    if found is None:
        return PromptLineage(origin=PromptOrigin.FRESH)
    best, most = found
    return PromptLineage(
        origin=PromptOrigin.DIVERGED,
        base_seq=best.seq,
        base_attempt=best.attempt,
        shared_tokens=most,
        base_tokens=best.tokens,
    )


# ---------------------------------------------------------------- planning a prompt


@dataclass(frozen=True, slots=True)
class PromptPlan:
    ids: tuple[int, ...]
    lineage: PromptLineage
    tail_text: str
    """The text rendered for this call (all of it, or what follows the spliced
    turn); its end is the generation prompt."""
    packed: bytes
    """``ids`` packed (the record store's and the transcript's form)."""


def plan_prompt(
    template: ChatTemplate,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
    transcript: Transcript,
    *,
    kwargs: JsonObject,
    most: int | None = None,
) -> PromptPlan:
    """The prompt of a call: spliced onto the call it extends, else rendered whole.
    ``most``: a prompt of more tokens raises
    :class:`~polar.proxy.render.tokenbound.TooManyTokens` without being
    tokenized whole."""
    base = extended_call(messages, transcript)
    if base is None:
        ids, text = template.render(messages, tools, kwargs=kwargs, most=most)
        packed = pack(ids)
        return PromptPlan(
            ids=tuple(ids),
            lineage=_lineage(packed, None, transcript),
            tail_text=text,
            packed=packed,
        )
    glue: tuple[int, ...] = ()
    if len(base.full) == len(base.prompt) or base.full.last() != template.end_of_turn_id:
        # The turn was cut short (length limit): close it as the template would.
        glue = (template.end_of_turn_id,)
    room = None if most is None else most - len(base.full) - len(glue)
    try:
        tail, text = template.continuation(
            messages, tools, len(base.messages), kwargs=kwargs, most=room
        )
    except TooManyTokens as exc:
        raise TooManyTokens(len(base.full) + len(glue) + exc.at_least) from None
    head = base.full.packed()
    new = glue + tuple(tail)
    return PromptPlan(
        ids=unpack(head) + new,
        packed=head + pack(new),
        lineage=PromptLineage(
            origin=PromptOrigin.EXTENDS,
            base_seq=base.seq,
            base_attempt=base.attempt,
            shared_tokens=len(base.full),
            base_tokens=len(base.full),
            spliced=True,
        ),
        tail_text=text,
    )
