"""The Gemini API through the gateway: the scripted engine behind, both capture
modes; every streamed chunk checked against Google's documented
``GenerateContentResponse`` shape, every error against Google's error shape.

The requests are shaped as the Gemini CLI sends them (``contents`` with a
``functionCall`` carrying the CLI's own id and a ``thoughtSignature``,
``parametersJsonSchema``, a routing classifier's ``responseJsonSchema`` with
upper-case types); the CLI's recorded requests are in
``tests/fixtures/harness/gemini_cli``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from polar.ir import EditKind, FinishReason, PromptOrigin, Role, ToolChoiceMode
from polar.proxy.dialects.gemini.protocol import GenerateContentRequest
from polar.proxy.dialects.gemini.translate import json_schema, request_from_ir, request_to_ir
from polar.testing.scripted.vllm_wire import logprob_for

from support.grammar import check_gemini_stream, gemini_events

SHELL = {
    "name": "run_shell_command",
    "description": "Run a shell command.",
    "parametersJsonSchema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
SYSTEM = {"parts": [{"text": "You are Gemini CLI."}]}
USER = {"role": "user", "parts": [{"text": "Write polar into proof.txt"}]}
CONFIG = {"temperature": 1, "topP": 0.95, "topK": 64, "thinkingConfig": {"includeThoughts": True}}
TOOL_TURN = {
    "reasoning": "I will write the file.",
    "text": "Writing it.",
    "tool_calls": [{"name": "run_shell_command", "arguments": {"command": "echo polar"}}],
}
CAPTURES = ["engine_rendered", "token_in_token_out"]
STREAM = "/v1beta/models/gemini-3.8-flash:streamGenerateContent?alt=sse"
UNARY = "/v1beta/models/gemini-3.5-flash-lite:generateContent"


def body(**fields: Any) -> dict[str, Any]:
    return {
        "contents": [USER],
        "systemInstruction": SYSTEM,
        "tools": [{"functionDeclarations": [SHELL]}],
        "generationConfig": CONFIG,
        **fields,
    }


def post(stack: Any, key: str, payload: dict[str, Any], path: str = STREAM) -> httpx.Response:
    return httpx.post(
        f"{stack.url}{path}", headers={"x-goog-api-key": key}, json=payload, timeout=30
    )


def check_error(reply: httpx.Response, status: int, needle: str) -> None:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"code", "message", "status"}, error
    assert error["code"] == status and isinstance(error["status"], str), error
    assert needle in error["message"], error


@pytest.mark.parametrize("capture", CAPTURES)
def test_a_streamed_function_call_follows_the_chunk_grammar(
    make_stack: Any, tokenizer: Any, capture: str
) -> None:
    stack = make_stack({"turns": [TOOL_TURN]}, capture=capture)
    sid, key = stack.new_session()
    reply = post(stack, key, body())
    assert reply.status_code == 200 and reply.headers["content-type"].startswith(
        "text/event-stream"
    )
    assert "[DONE]" not in reply.text and "event:" not in reply.text
    response = check_gemini_stream(gemini_events(reply.text))
    (candidate,) = response["candidates"]
    thought, text, call = candidate["content"]["parts"]
    assert thought == {"text": "I will write the file.\n", "thought": True}
    assert text == {"text": "\n\nWriting it.\n"}
    assert call == {
        "functionCall": {"name": "run_shell_command", "args": {"command": "echo polar"}}
    }
    assert candidate["finishReason"] == "STOP" and response["modelVersion"] == "gemini-3.8-flash"
    (record,) = stack.records(sid)
    assert record.original_request["model"] == "models/gemini-3.8-flash"
    assert record.finish_reason is FinishReason.TOOL_CALLS
    usage = response["usageMetadata"]
    assert usage["promptTokenCount"] == len(record.prompt_ids)
    # Gemini counts thoughts apart from the candidate's tokens.
    assert usage["candidatesTokenCount"] + usage.get("thoughtsTokenCount", 0) == len(
        record.output_ids
    )
    assert list(record.output_logprobs) == [
        logprob_for(i, t) for i, t in enumerate(record.output_ids)
    ]
    # What the client received is exactly what the model sampled.
    expected = (
        f"{thought['text']}</think>{text['text']}"
        '<tool_call>\n{"name": "run_shell_command", "arguments": {"command": "echo polar"}}'
        "\n</tool_call><|im_end|>"
    )
    assert tokenizer.decode(list(record.output_ids)) == expected
    # The harness's sampling stands (no policy): Gemini's names, the IR's fields.
    assert record.behaviour is not None
    sampling = record.behaviour.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (1.0, 0.95, 64)


@pytest.mark.parametrize("capture", CAPTURES)
def test_the_cli_s_second_turn_extends_the_first(make_stack: Any, capture: str) -> None:
    after_tool = (
        {"prompt_contains": "<tool_response>"}
        if capture == "token_in_token_out"
        else {"last_role": "tool"}
    )
    stack = make_stack(
        {"turns": [TOOL_TURN, {"text": "Done.", "expect": after_tool}]}, capture=capture
    )
    sid, key = stack.new_session()
    first = check_gemini_stream(gemini_events(post(stack, key, body()).text))
    parts = first["candidates"][0]["content"]["parts"]
    call = next(p for p in parts if "functionCall" in p)["functionCall"]
    # As the Gemini CLI replays it: thoughts dropped, the text and the call kept,
    # the call under an id of the CLI's own with a thought signature.
    call_id = "run_shell_command_1795758778433_0"
    history = [
        USER,
        {
            "role": "model",
            "parts": [
                {"text": "\n\nWriting it.\n"},
                {
                    "functionCall": {"id": call_id, **call},
                    "thoughtSignature": "skip_thought_signature_validator",
                },
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "id": call_id,
                        "name": "run_shell_command",
                        "response": {"output": "Output: (empty)"},
                    }
                }
            ],
        },
    ]
    second = check_gemini_stream(gemini_events(post(stack, key, body(contents=history)).text))
    parts = second["candidates"][0]["content"]["parts"]
    assert [p for p in parts if not p.get("thought")] == [{"text": "\n\nDone."}]
    _, record = stack.records(sid)
    lineage = record.lineage
    assert lineage is not None and lineage.base_seq == 1
    if capture == "token_in_token_out":
        assert lineage.origin is PromptOrigin.EXTENDS and lineage.spliced
    else:  # the engine renders history itself; the lineage says whether it still extends
        assert lineage.origin in (PromptOrigin.EXTENDS, PromptOrigin.REWRITTEN)


def test_a_routing_classifier_call_is_served_and_recorded_under_its_model(
    make_stack: Any,
) -> None:
    """The Gemini CLI's classifier: unary, another model name, a JSON schema with
    Google's upper-case types, sent to the engine as a JSON-schema response format."""
    answer = '{"complexity_reasoning": "Simple.", "complexity_score": 20}'
    stack = make_stack({"turns": [{"text": answer}]})
    sid, key = stack.new_session()
    schema = {
        "type": "OBJECT",
        "properties": {
            "complexity_reasoning": {"type": "STRING"},
            "complexity_score": {"type": "INTEGER"},
        },
        "required": ["complexity_reasoning", "complexity_score"],
    }
    config = {
        **CONFIG,
        "responseMimeType": "application/json",
        "responseJsonSchema": schema,
        "thinkingConfig": {"includeThoughts": True, "thinkingLevel": "HIGH"},
    }
    reply = post(stack, key, {"contents": [USER], "generationConfig": config}, UNARY)
    assert reply.status_code == 200, reply.text
    response = reply.json()
    (candidate,) = response["candidates"]
    texts = [p["text"] for p in candidate["content"]["parts"] if not p.get("thought")]
    assert json.loads("".join(texts)) == json.loads(answer)
    assert candidate["finishReason"] == "STOP" and response["modelVersion"] == (
        "gemini-3.5-flash-lite"
    )
    (record,) = stack.records(sid)
    assert record.original_request["model"] == "models/gemini-3.5-flash-lite"
    assert record.stream is False
    (sent,) = stack.engine.requests
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "response", "schema": schema},
    }


def test_a_unary_reply_shows_thoughts_only_when_asked(make_stack: Any) -> None:
    stack = make_stack({"turns": [TOOL_TURN]})
    _, key = stack.new_session()
    reply = post(stack, key, body(generationConfig={"temperature": 0.5}), UNARY).json()
    parts = reply["candidates"][0]["content"]["parts"]
    assert [sorted(p) for p in parts] == [["text"], ["functionCall"]], parts
    usage = reply["usageMetadata"]
    assert usage["totalTokenCount"] == (
        usage["promptTokenCount"] + usage["candidatesTokenCount"] + usage["thoughtsTokenCount"]
    )


def test_finish_reasons_map_to_gemini_s(make_stack: Any) -> None:
    stack = make_stack(
        {"turns": [{"text": "one two three four five", "finish": "length", "max_tokens": 4}]}
    )
    sid, key = stack.new_session()
    reply = post(stack, key, body(generationConfig={"maxOutputTokens": 4}))
    response = check_gemini_stream(gemini_events(reply.text))
    assert response["candidates"][0]["finishReason"] == "MAX_TOKENS"
    (record,) = stack.records(sid)
    assert record.engine_request["max_tokens"] == 4


def test_logprobs_come_as_gemini_s_logprobs_result_without_token_ids(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "Hello there."}]})
    sid, key = stack.new_session()
    config = {"responseLogprobs": True, "logprobs": 2}
    response = post(stack, key, body(generationConfig=config), UNARY).json()
    (candidate,) = response["candidates"]
    (record,) = stack.records(sid)
    chosen = candidate["logprobsResult"]["chosenCandidates"]
    assert [c["logProbability"] for c in chosen] == pytest.approx(list(record.output_logprobs))
    assert all(set(c) == {"token", "logProbability"} for c in chosen), chosen
    assert len(candidate["logprobsResult"]["topCandidates"]) == len(record.output_ids)
    assert "tokenId" not in json.dumps(response)
    streamed = post(stack, key, body(generationConfig=config))
    events = gemini_events(streamed.text)
    got = [c for e in events for c in e["candidates"][0]["logprobsResult"]["chosenCandidates"]]
    assert len(got) == len(stack.records(sid)[-1].output_ids)


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda b: b["contents"][0]["parts"].append({"executableCode": {}}), "'executableCode'"),
        (lambda b: b["contents"][0]["parts"].append({"hologram": 1}), "'hologram'"),
        (lambda b: b["contents"][0]["parts"].append({"text": "a", "inlineData": {}}), "one kind"),
        (lambda b: b["tools"].append({"googleSearch": {}}), "server tool"),
        (lambda b: b["contents"][0].update(role="wizard"), "role"),
        (lambda b: b.pop("contents"), "contents: field required"),
        (lambda b: b["generationConfig"].update(candidateCount=2), "candidateCount"),
        (lambda b: b["generationConfig"].update(responseMimeType="text/x.enum"), "x.enum"),
        (lambda b: b["generationConfig"].update(temperature=3), "temperature"),
        (
            lambda b: b["contents"][0]["parts"].append({"inlineData": {"mimeType": "audio/wav"}}),
            "audio/wav",
        ),
        (
            lambda b: b.update(
                toolConfig={
                    "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["nope"]}
                }
            ),
            "'nope'",
        ),
    ],
)
def test_bad_requests_get_gemini_errors(make_stack: Any, mutate: Any, needle: str) -> None:
    stack = make_stack({"turns": []})
    sid, key = stack.new_session()
    payload = json.loads(json.dumps(body()))
    mutate(payload)
    check_error(post(stack, key, payload), 400, needle)
    assert stack.engine.requests == [] and stack.records(sid) == []


@pytest.mark.parametrize(
    ("path", "status", "needle"),
    [
        ("/v1beta/models/m:streamGenerateContent", 400, "alt=sse"),
        ("/v1beta/models/m:embedContent", 404, "not a Gemini API method"),
        ("/v1beta/models/a/b:generateContent", 404, "not a model name"),
        ("/v1beta/models/:generateContent", 404, "not a model name"),
        ("/v1beta/models/m", 404, "not a Gemini API method"),
    ],
)
def test_unknown_methods_get_gemini_errors(
    make_stack: Any, path: str, status: int, needle: str
) -> None:
    stack = make_stack({"turns": []})
    _, key = stack.new_session()
    check_error(post(stack, key, body(), path), status, needle)


def test_other_methods_on_gemini_paths_get_gemini_errors(make_stack: Any) -> None:
    stack = make_stack({"turns": []})
    _, key = stack.new_session()
    reply = httpx.get(f"{stack.url}{UNARY}", headers={"x-goog-api-key": key}, timeout=30)
    assert reply.status_code in (404, 405)
    check_error(reply, reply.status_code, "GET /v1beta/models/gemini-3.5-flash-lite")


def test_the_key_comes_as_a_header_or_in_the_query(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "one"}, {"text": "two"}]})
    sid, key = stack.new_session()
    by_query = httpx.post(f"{stack.url}{UNARY}?key={key}", json=body(), timeout=30)
    assert by_query.status_code == 200, by_query.text
    assert post(stack, key, body(), UNARY).status_code == 200
    assert len(stack.records(sid)) == 2
    check_error(post(stack, "AIza-not-a-session", body(), UNARY), 401, "unknown or closed")
    missing = httpx.post(f"{stack.url}{UNARY}", json=body(), timeout=30)
    check_error(missing, 401, "missing API key")
    assert missing.json()["error"]["status"] == "UNAUTHENTICATED"


@pytest.mark.parametrize("capture", CAPTURES)
def test_count_tokens_counts_what_would_be_rendered(make_stack: Any, capture: str) -> None:
    stack = make_stack({"turns": [{"text": "ok"}]}, capture=capture)
    sid, key = stack.new_session()
    path = "/v1beta/models/gemini-3.8-flash:countTokens"
    inner = post(stack, key, {"generateContentRequest": body()}, path).json()["totalTokens"]
    post(stack, key, body(), UNARY)
    (record,) = stack.records(sid)
    assert inner == len(record.prompt_ids)
    bare = post(stack, key, {"contents": [USER]}, path)
    assert 0 < bare.json()["totalTokens"] < inner
    check_error(post(stack, key, {}, path), 400, "contents")


def test_a_request_goes_to_the_ir_and_back_without_loss() -> None:
    """Beyond what the Gemini CLI sends: Google's own schema type, images, a
    response without an id paired to its call by name, tool config, safety
    settings, stop sequences and thinking settings."""
    wire = {
        "model": "models/gemini-2.5-pro",
        "systemInstruction": {"role": "system", "parts": [{"text": "a"}, {"text": "b"}]},
        "contents": [
            {
                "role": "user",
                "parts": [
                    {"text": "look"},
                    {"inlineData": {"mimeType": "image/png", "data": "iVBOR"}},
                    {"fileData": {"mimeType": "image/jpeg", "fileUri": "gs://b/x.jpg"}},
                ],
            },
            {
                "role": "model",
                "parts": [
                    {"text": "hmm", "thought": True, "thoughtSignature": "c2ln"},
                    {"functionCall": {"name": "ls", "args": {"dir": "."}}},
                    {"functionCall": {"name": "ls"}},
                ],
            },
            {
                "parts": [
                    {"functionResponse": {"name": "ls", "response": {"error": "denied"}}},
                    {"functionResponse": {"name": "ls", "response": {"files": ["a", 1.5]}}},
                    {"text": "go on"},
                ]
            },
        ],
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "ls",
                        "parameters": {
                            "type": "OBJECT",
                            "properties": {"dir": {"type": "STRING", "nullable": True}},
                        },
                        "behavior": "BLOCKING",
                    },
                    {"name": "noop"},
                ]
            },
            {},
        ],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["ls"]}},
        "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
        "generationConfig": {
            "stopSequences": [],
            "maxOutputTokens": 100,
            "seed": 7,
            "thinkingConfig": {"thinkingBudget": 0},
        },
        "cachedContent": "cachedContents/x",
    }
    request = request_to_ir(GenerateContentRequest.model_validate(wire), stream=False)
    assert request_from_ir(request) == wire
    roles = [m.role for m in request.messages]
    assert roles == [Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL, Role.TOOL, Role.USER]
    calls = request.messages[2].tool_calls
    first, second = request.messages[3], request.messages[4]
    assert (first.tool_call_id, second.tool_call_id) == (calls[0].id, calls[1].id)
    assert first.is_error and first.text == "denied"
    assert json.loads(second.text) == {"files": ["a", 1.5]}
    assert request.tools[0].parameters == {
        "type": "object",
        "properties": {"dir": {"type": "string", "nullable": True}},
    }
    assert request.tool_choice is not None and request.tool_choice.mode is ToolChoiceMode.NAMED
    assert request.template_kwargs == {"enable_thinking": False}
    assert request.sampling.max_tokens == 100 and request.sampling.seed == 7


def test_google_s_schema_types_become_json_schema_types() -> None:
    schema = {
        "type": "OBJECT",
        "properties": {
            "tags": {"type": "ARRAY", "items": {"type": "STRING", "enum": ["A"]}},
            "type": {"type": "NUMBER", "description": "a property named type"},
        },
        "anyOf": [{"type": "NULL"}],
    }
    assert json_schema(schema) == {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "enum": ["A"]}},
            "type": {"type": "number", "description": "a property named type"},
        },
        "anyOf": [{"type": "null"}],
    }


def test_no_output_limit_gets_the_rest_of_the_context(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "ok"}]})
    sid, key = stack.new_session()
    post(stack, key, body(), UNARY)
    (record,) = stack.records(sid)
    assert [e.kind for e in record.edits] == [EditKind.DEFAULTED_MAX_TOKENS]
