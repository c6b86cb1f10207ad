"""Simulated gateway sessions with the real Qwen3 chat template, for builder tests.

A :class:`Session` plays a harness: conversations (the main agent, sub-agents,
side calls) make calls, and each call becomes the :class:`CompletionRecord` the
gateway would have written in the chosen capture mode. Token-in/token-out: the
prompt comes from the gateway's own planner (raw sampled ids spliced back);
engine-rendered: the chat template applied to the whole conversation, as vLLM
does. Outputs are the tokens of a Qwen3-style reply (reasoning, text, tool
calls), possibly cut at a length limit; logprobs are deterministic and unique
per record and position, so a moved or altered logprob is caught.

The harness resends replies the way real ones do (reasoning dropped, tool
results appended) and can misbehave on purpose: retry a call, drop a reply,
edit history, compact, fail, abort. Every record carries what the simulator
knows about it (:class:`Truth`): which conversation and class it belongs to,
and, for token-mode captures, the relation to its conversation's previous call.
"""

from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from polar.ir import (
    CallError,
    CaptureMode,
    CompletionRecord,
    Dialect,
    ErrorKind,
    FinishReason,
    MalformedToolCall,
    Message,
    RecordStatus,
    Role,
    TextPart,
    Timings,
    ToolCall,
    ToolSpec,
)
from polar.proxy.render.parse import OutputParser, ParserOptions
from polar.proxy.render.splice import PastCall, Transcript, lineage_of, plan_prompt
from polar.proxy.render.template import ChatTemplate
from polar.trajectory import BreakReason, ChainClass, Relation

TOOLS = (
    ToolSpec(
        name="bash",
        description="Run a command.",
        parameters={"type": "object", "properties": {"command": {"type": "string"}}},
    ),
    ToolSpec(
        name="edit",
        description="Edit a file.",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
        },
    ),
)
MAIN_SYSTEM = "You are a coding agent. Use the tools to fix the repository."
SUB_SYSTEM = "You are a sub-agent. Investigate one question and report back."
TITLE_SYSTEM = "Write a five-word title for the user's request."
SUMMARY_REQUEST = "Summarize the conversation so far in one paragraph."
"""Sent as a fork of the main conversation; tests claim it with a class rule."""


def system(text: str) -> Message:
    return Message(role=Role.SYSTEM, parts=(TextPart(text),))


def user(text: str) -> Message:
    return Message(role=Role.USER, parts=(TextPart(text),))


def logprob_of(seq: int, attempt: int, position: int) -> float:
    """Unique per (record, position), in (-8, 0)."""
    mixed = (seq * 1_000_003 + attempt * 7919 + position * 104_729) % 999_983
    return -(0.0001 + 8 * mixed / 999_983)


@dataclass
class Turn:
    """One scripted reply: reasoning, text, tool calls (argument dicts), length cut."""

    reasoning: str | None = None
    text: str = ""
    calls: tuple[dict[str, str], ...] = ()
    cut: int | None = None
    """Keep only this many sampled tokens (finish ``length``, no end-of-turn)."""

    def sampled_text(self) -> str:
        out = (self.reasoning or "").strip("\n") + "\n</think>\n\n" + self.text
        for i, args in enumerate(self.calls):
            if i or self.text:
                out += "\n"
            name = "bash" if "command" in args else "edit"
            body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
            out += f"<tool_call>\n{body}\n</tool_call>"
        return out + "<|im_end|>"


@dataclass
class Truth:
    conversation: str
    chain_class: ChainClass
    relation: Relation | None
    """Token mode: the relation to the conversation's previous completed call
    (None: its first call, or a call whose relation the harness left open)."""
    expected_break: BreakReason | None
    """Token mode, when ``relation`` is known: the break the builder must report
    at this call (None: it continues the trace before)."""


@dataclass
class Conversation:
    name: str
    chain_class: ChainClass
    tools: tuple[ToolSpec, ...]
    messages: list[Message]
    sent: list[Message] = field(default_factory=list)
    """The messages of its last completed call."""
    last: CompletionRecord | None = None
    pending_relation: Relation | None = None


class Session:
    def __init__(
        self, template: ChatTemplate, capture: CaptureMode, session_id: str = "ses_sim"
    ) -> None:
        self.template = template
        self.capture = capture
        self.session_id = session_id
        self.records: list[CompletionRecord] = []
        self.truth: dict[str, Truth] = {}
        self.policy_version = 0
        self.seq = 0
        self.transcript = Transcript(calls=deque(maxlen=10_000))
        self._ids = 0

    # ------------------------------------------------------------ conversations

    def conversation(
        self, name: str, chain_class: ChainClass, system_text: str, task: str, *, tools: bool = True
    ) -> Conversation:
        return Conversation(
            name=name,
            chain_class=chain_class,
            tools=TOOLS if tools else (),
            messages=[system(system_text), user(task)],
        )

    # ------------------------------------------------------------ calls

    def call(
        self,
        conv: Conversation,
        turn: Turn,
        *,
        outcome: str = "ok",
        logprobs: str = "full",
        messages: list[Message] | None = None,
        relation: Relation | None = None,
        known: bool = True,
    ) -> CompletionRecord:
        """One call of ``conv`` (``messages``: what it sends, default its history).

        ``outcome``: ``ok``; ``gateway_retry`` (a failed first attempt, then the
        same call completes); ``failed`` / ``aborted`` (partial output, then the
        harness sends the same request again, which completes). ``relation`` is
        what the harness did to the conversation (default: appended to it);
        ``known=False`` when that does not determine the relation.
        """
        sent = list(conv.messages if messages is None else messages)
        prompt, lineage = self._prompt(conv, sent)
        self.seq += 1
        if outcome == "gateway_retry":
            self._broken(conv, prompt, lineage, sent, RecordStatus.FAILED, attempt=1, partial=0)
            return self._complete(
                conv, turn, prompt, lineage, sent, relation, known, logprobs, attempt=2
            )
        if outcome in ("failed", "aborted"):
            status = RecordStatus.FAILED if outcome == "failed" else RecordStatus.ABORTED
            self._broken(conv, prompt, lineage, sent, status, attempt=1, partial=3, turn=turn)
            self.seq += 1
            prompt, lineage = self._prompt(conv, sent)
        return self._complete(
            conv, turn, prompt, lineage, sent, relation, known, logprobs, attempt=1
        )

    def _prompt(self, conv: Conversation, sent: list[Message]) -> tuple[tuple[int, ...], Any]:
        if self.capture is CaptureMode.TOKEN_IN_TOKEN_OUT:
            plan = plan_prompt(self.template, sent, conv.tools, self.transcript, kwargs={})
            return plan.ids, plan.lineage
        ids, _ = self.template.render(sent, conv.tools, kwargs={})
        return tuple(ids), lineage_of(ids, sent, self.transcript)

    def _output(self, turn: Turn) -> tuple[tuple[int, ...], Message, FinishReason, int]:
        ids = tuple(self.template.text.encode(turn.sampled_text()))
        if turn.cut is not None and turn.cut < len(ids):
            ids = ids[: turn.cut]
        text = self.template.text.decode(ids)
        message, malformed = self._parse(text, bool(turn.calls))
        if turn.cut is not None and ids[-1:] != (self.template.end_of_turn_id,):
            finish = FinishReason.LENGTH
        elif message.tool_calls:
            finish = FinishReason.TOOL_CALLS
        else:
            finish = FinishReason.STOP
        return ids, message, finish, malformed

    def _parse(self, text: str, tools: bool) -> tuple[Message, int]:
        def make_id() -> str:
            self._ids += 1
            return f"call_{self._ids}"

        parser = OutputParser(ParserOptions(), tools=TOOLS, in_reasoning=True, make_id=make_id)
        piece = parser.feed(text.removesuffix("<|im_end|>"))
        piece.extend(parser.finish())
        calls: dict[int, list[str]] = {}
        for delta in piece.tool_calls:
            if delta.discard:
                calls.pop(delta.index, None)
                continue
            slot = calls.setdefault(delta.index, ["", "", ""])
            slot[0] = delta.id or slot[0]
            slot[1] += delta.name or ""
            slot[2] += delta.arguments
        parts: list[Any] = [TextPart(piece.text)] if piece.text else []
        parts += [ToolCall(id=i, name=n, arguments=a) for i, n, a in calls.values()]
        return Message(role=Role.ASSISTANT, parts=tuple(parts)), len(parser.malformed)

    def _record(self, **fields: Any) -> CompletionRecord:
        record = CompletionRecord(
            session_id=self.session_id,
            dialect=Dialect.OPENAI_CHAT,
            capture=self.capture,
            engine="scripted",
            model="scripted",
            policy_version=self.policy_version,
            stream=True,
            engine_request={},
            timings=Timings(arrived=float(self.seq)),
            **fields,
        )
        self.records.append(record)
        return record

    def _broken(
        self,
        conv: Conversation,
        prompt: tuple[int, ...],
        lineage: Any,
        sent: list[Message],
        status: RecordStatus,
        *,
        attempt: int,
        partial: int,
        turn: Turn | None = None,
    ) -> None:
        output: tuple[int, ...] = ()
        if turn is not None:
            output = tuple(self.template.text.encode(turn.sampled_text()))[:partial]
        if status is RecordStatus.FAILED and self.capture is CaptureMode.ENGINE_RENDERED:
            # The engine gave no prompt ids before it failed.
            prompt = prompt if output else ()
        kind = (
            ErrorKind.ENGINE_UNAVAILABLE
            if status is RecordStatus.FAILED
            else ErrorKind.CLIENT_DISCONNECTED
        )
        record = self._record(
            seq=self.seq,
            attempt=attempt,
            status=status,
            original_request={"model": conv.name, "messages": len(sent)},
            prompt_ids=prompt,
            output_ids=output,
            output_logprobs=tuple(logprob_of(self.seq, attempt, i) for i in range(len(output))),
            error=CallError(kind, "simulated"),
            lineage=lineage,
        )
        self.truth[record.key] = Truth(conv.name, conv.chain_class, None, None)

    def _complete(
        self,
        conv: Conversation,
        turn: Turn,
        prompt: tuple[int, ...],
        lineage: Any,
        sent: list[Message],
        relation: Relation | None,
        known: bool,
        logprobs: str,
        *,
        attempt: int,
    ) -> CompletionRecord:
        output, message, finish, malformed = self._output(turn)
        values = [logprob_of(self.seq, attempt, i) for i in range(len(output))]
        if logprobs == "missing" and values:
            values = values[: len(values) // 2]
        elif logprobs == "nan" and values:
            values[len(values) // 2] = math.nan
        record = self._record(
            seq=self.seq,
            attempt=attempt,
            status=RecordStatus.COMPLETED,
            original_request={"model": conv.name, "messages": len(sent)},
            prompt_ids=prompt,
            output_ids=output,
            output_logprobs=tuple(values),
            finish_reason=finish,
            message=message,
            lineage=lineage,
            malformed_tool_calls=tuple(
                MalformedToolCall("", "simulated") for _ in range(malformed)
            ),
        )
        base = lineage.base_seq if lineage is not None else None
        on = self.transcript.find(base, lineage.base_attempt) if base is not None else None
        self.transcript.add(
            PastCall.of(self.seq, attempt, tuple(sent), prompt, output, message, on=on)
        )
        if conv.last is None or not known:
            expected_relation = None
        elif relation is not None:
            expected_relation = relation
        else:
            previous = conv.last.output_ids
            cut = bool(previous) and previous[-1] != self.template.end_of_turn_id
            expected_relation = Relation.CLOSED if cut else Relation.EXTENDS
        expected_break = None
        if expected_relation is not None and conv.last is not None:
            if expected_relation in (Relation.EXTENDS, Relation.CLOSED):
                if conv.last.policy_version != record.policy_version:
                    expected_break = BreakReason.POLICY_CHANGED
            else:
                expected_break = BreakReason(expected_relation.value)
        self.truth[record.key] = Truth(
            conv.name, conv.chain_class, expected_relation, expected_break
        )
        conv.last = record
        conv.sent = sent
        self._answer(conv, sent, message, len(self.records))
        return record

    def _answer(self, conv: Conversation, sent: list[Message], reply: Message, k: int) -> None:
        """The harness appends the reply (reasoning dropped) and what answers it."""
        history = [*sent, reply]
        if reply.tool_calls:
            history += [
                Message(role=Role.TOOL, parts=(TextPart(f"ran {c.name} ({k})"),), tool_call_id=c.id)
                for c in reply.tool_calls
            ]
        else:
            history.append(user(f"Next step, please ({k})."))
        conv.messages = history

    # ------------------------------------------------------------ harness misbehaviour

    def retry(self, conv: Conversation, turn: Turn) -> CompletionRecord:
        """Send the last call's request again, unchanged (its reply is discarded)."""
        return self.call(conv, turn, messages=conv.sent, relation=Relation.RETRY)

    def drop_reply(self, conv: Conversation, turn: Turn) -> CompletionRecord:
        """Drop the last reply and ask the model to go on from the same history."""
        messages = [*conv.sent, user("Please continue.")]
        return self.call(conv, turn, messages=messages, relation=Relation.DROPPED_TURN)

    def edit(self, conv: Conversation, turn: Turn, index: int) -> CompletionRecord:
        """Change the text of an earlier (already sent) tool result or user message."""
        old = conv.messages[index]
        edited = Message(
            role=old.role, parts=(TextPart(f"(edited) {old.text}"),), tool_call_id=old.tool_call_id
        )
        conv.messages = [*conv.messages[:index], edited, *conv.messages[index + 1 :]]
        # The prompt branches off the last call it still contains: which line the
        # chain follows depends on what comes later, so no relation is expected.
        return self.call(conv, turn, known=False)

    def editable(self, conv: Conversation) -> list[int]:
        """Messages an edit may change: sent before, after the task and the first reply."""
        return [
            i
            for i in range(3, len(conv.sent))
            if conv.sent[i].role in (Role.TOOL, Role.USER) and i < len(conv.messages)
        ]
