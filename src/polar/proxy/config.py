"""The gateway's typed configuration, read once at start-up.

Sources, later winning: a YAML file, then command-line flags (``polar gateway
--help``). Validation happens here, once; a bad value is reported as one line
naming the field, e.g. ``engine.base_url: field required``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from polar.configfile import load_config
from polar.ir import CaptureMode, LogprobSource, Sampling
from polar.proxy.call.behaviour import SamplingPolicy


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineConfig(_Section):
    kind: str = Field(
        default="vllm",
        description="Engine plug-in: 'vllm', 'sglang', 'embedded' (token-in/token-out only), "
        "or a dotted path 'package.module:factory'.",
    )
    base_url: str = Field(
        description="Base URL of the inference server, e.g. http://127.0.0.1:8011"
    )
    pool: list[str] = Field(
        default_factory=list,
        description="Further engines serving the same model as base_url: calls are spread "
        "over all of them by outstanding requests, each session sticking to one engine; an "
        "engine that cannot be reached or times out is left out for eject_s seconds.",
    )
    eject_s: float = Field(
        default=10.0, gt=0, description="How long a pooled engine that failed is left out."
    )
    model: str = Field(description="Model name the engine serves; every request is sent with it.")
    api_key: str | None = Field(default=None, description="Bearer token for the engine, if any.")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    read_timeout_s: float = Field(
        default=900.0,
        gt=0,
        description="Longest wait for the first byte of the engine's reply (its queue and "
        "prefill; for a reply that is not streamed, the whole generation).",
    )
    idle_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="Longest silence between bytes once a streamed reply has begun "
        "(a stalled engine fails the call after this long).",
    )
    total_timeout_s: float = Field(
        default=3600.0, gt=0, description="Longest one engine call may take, all told."
    )
    max_connections: int = Field(default=1024, ge=1)
    keepalive_s: float = Field(
        default=4.0,
        gt=0,
        description="An idle engine connection is reused only within this many seconds "
        "(below the engine's own keep-alive: vLLM and SGLang close idle connections after "
        "5 s, and a request sent as they do is lost).",
    )
    max_attempts: int = Field(
        default=3, ge=1, description="Attempts per call for transient engine failures."
    )
    retry_backoff_s: float = Field(default=0.25, ge=0)
    template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="chat_template_kwargs sent with every call (e.g. enable_thinking).",
    )
    max_model_len: int | None = Field(
        default=None,
        ge=1,
        description="The model's context length in tokens (default: what the engine's "
        "GET /v1/models reports as max_model_len). Output limits are kept within it.",
    )
    default_max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Output limit for calls that ask for none (default: the rest of the context).",
    )
    logprobs: LogprobSource | None = Field(
        default=None,
        description="What the engine's reported logprobs are of: raw (before temperature and "
        "truncation: vLLM's default), scaled (after temperature: SGLang's default) or "
        "processed (the distribution sampled from: vLLM with --logprobs-mode "
        "processed_logprobs, the embedded engine). Default: by kind (vllm raw, sglang scaled, "
        "embedded processed, a plug-in raw). A trainer trains only tokens whose sampling "
        "distribution these logprobs are of.",
    )

    @property
    def logprob_source(self) -> LogprobSource:
        if self.logprobs is not None:
            return self.logprobs
        return {"sglang": LogprobSource.SCALED, "embedded": LogprobSource.PROCESSED}.get(
            self.kind, LogprobSource.RAW
        )

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _http_url(value)

    @field_validator("pool")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        urls = [_http_url(url) for url in value]
        if len(set(urls)) != len(urls):
            raise ValueError("names an engine twice")
        return urls

    @property
    def urls(self) -> tuple[str, ...]:
        """Every engine: ``base_url`` first, then the ``pool``."""
        return (self.base_url, *(url for url in self.pool if url != self.base_url))


def _http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https://")
    return value.rstrip("/")


class RenderConfig(_Section):
    """Gateway-side rendering and parsing: the chat template with ``capture:
    token_in_token_out``; the tokenizer, parser and stop tokens in both modes."""

    tokenizer: Path | None = Field(
        default=None,
        description="Hugging Face tokenizer directory with the model's chat template "
        "(default: the bundled Qwen3 tokenizer).",
    )
    template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra chat-template variables (e.g. enable_thinking)."
    )
    tool_format: Literal["hermes", "qwen3_coder"] = Field(
        default="hermes", description="How the model writes tool calls."
    )
    tool_prompt: Literal["auto", "template", "hermes"] = Field(
        default="auto",
        description="Token-in/token-out: who writes the tools offered, the calls in assistant "
        "turns and the tool results into the prompt. 'template': the chat template. "
        "'hermes': the gateway, for a template with no tool section (SmolLM2's): the tools "
        "in the system turn inside <tools></tools>, each call as <tool_call>{json}</tool_call> "
        "in the assistant's text, each result inside <tool_response></tool_response> "
        "(needs tool_format hermes). 'auto': hermes when the template renders a "
        "conversation alike with tools and without, else template.",
    )
    reasoning: bool = Field(
        default=True,
        description="Parse <think>...</think> as reasoning (false for a model that does not "
        "think, e.g. SmolLM2).",
    )
    end_of_turn: str | None = Field(
        default=None, description="The token that ends a turn (default: the tokenizer's eos)."
    )
    stop_token_ids: list[int] = Field(
        default_factory=list, description="More token ids that end generation."
    )
    segment_cache_bytes: int = Field(
        default=64 << 20,
        ge=0,
        description="Token-in/token-out capture: memory for the ids of long stretches of "
        "rendered prompts (a harness's system prompt, a group's shared task), so each is "
        "tokenized once (0: tokenize every prompt whole).",
    )
    engine_output: Literal["gateway_parser", "engine_parser"] = Field(
        default="gateway_parser",
        description="Engine-rendered capture: derive what clients receive from the sampled "
        "ids with the gateway's parser, flagging where the engine's parse differs "
        "(the tokenizer must be the served model's), or relay the engine's parse unchecked.",
    )

    @field_validator("tool_prompt")
    @classmethod
    def _calls_are_parsed_as_prompted(cls, value: str, info: ValidationInfo) -> str:
        if value == "hermes" and info.data.get("tool_format") != "hermes":
            raise ValueError("asks for hermes tool calls: set tool_format: hermes")
        return value


class StoreConfig(_Section):
    path: Path = Field(default=Path("runs/gateway/records.db"), description="SQLite file.")
    synchronous: Literal["full", "normal"] = Field(
        default="normal",
        description="'normal' survives gateway crashes; 'full' also power loss (fsync per commit).",
    )
    write_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Longest a call waits for its record to commit before it fails with 503.",
    )


class LimitsConfig(_Section):
    """What one request may hold, checked before anything else reads it (400/413 in the
    dialect's error shape), and how much CPU-heavy work runs at once."""

    max_body_bytes: int = Field(default=32 << 20, ge=1024)
    max_json_depth: int = Field(
        default=64,
        ge=8,
        le=200,
        description="Deepest nesting of objects and arrays in a body (every later stage, "
        "serialising included, handles at least 255).",
    )
    max_string_chars: int = Field(
        default=4 << 20, ge=1024, description="Longest string (or object key) in a body."
    )
    max_array_items: int = Field(
        default=16384, ge=16, description="Most items in one array or object of a body."
    )
    max_messages: int = Field(
        default=10000, ge=1, description="Most messages (Responses: input items) in a request."
    )
    max_tools: int = Field(default=1024, ge=1, description="Most tools offered in a request.")
    render_workers: int = Field(
        default=2,
        ge=1,
        description="Worker threads that render and tokenize prompts (token-in/token-out) "
        "and parse large bodies, off the event loop.",
    )
    transcript_budget_bytes: int = Field(
        default=1 << 30,
        ge=1 << 20,
        description="Memory for the packed token ids of open sessions' recent calls (what "
        "splicing continues); past it the least recently used session's are dropped, and its "
        "next prompt is rendered afresh. A session's go when it closes.",
    )
    render_budget_bytes: int = Field(
        default=64 << 20,
        ge=1 << 20,
        description="Request bytes being rendered or parsed at once; more waits its turn.",
    )
    pause_wait_s: float = Field(
        default=600.0, ge=0, description="How long a call waits while the gateway is paused."
    )
    drain_timeout_s: float = Field(
        default=300.0, gt=0, description="Default wait for in-flight calls on pause."
    )


class SamplingDefaults(_Section):
    """Values for the settings a harness leaves unset (each default: the model's
    generation config in ``render.tokenizer``, else the neutral value)."""

    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = Field(default=None, gt=0)

    def sampling(self) -> Sampling:
        return Sampling(**self.model_dump())


class SamplingConfig(_Section):
    """What calls are sampled with (:mod:`polar.proxy.call.behaviour`)."""

    policy: SamplingPolicy | None = Field(
        default=None,
        description="Enforced on every call of a session that has no policy of its own: "
        "temperature, top_p, top_k, min_p replace what the harness asked; penalties, logit "
        "bias and seed are dropped. Default: none (the harness's settings stand).",
    )
    defaults: SamplingDefaults = Field(
        default=SamplingDefaults(),
        description="Sent for settings a harness leaves unset (default: the model's "
        "generation_config.json in render.tokenizer, else neutral).",
    )


class OpenAIChatConfig(_Section):
    reasoning_field: Literal["reasoning_content", "reasoning", "none"] = Field(
        default="reasoning_content",
        description="Field that carries reasoning to clients ('none' hides it).",
    )


class DialectsConfig(_Section):
    openai_chat: OpenAIChatConfig = OpenAIChatConfig()


class GatewayConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    keepalive_s: int = Field(
        default=75,
        ge=1,
        description="How long an idle client connection is kept open. Longer than the "
        "clients' own (Node 4 s, httpx 5 s): a client that sends as the gateway closes "
        "loses its request, so the client should be the one to close.",
    )
    admin_token: str = Field(min_length=16, description="Token for /admin endpoints.")
    capture: CaptureMode = CaptureMode.ENGINE_RENDERED
    engine: EngineConfig
    render: RenderConfig = RenderConfig()
    store: StoreConfig = StoreConfig()
    limits: LimitsConfig = LimitsConfig()
    dialects: DialectsConfig = DialectsConfig()
    sampling: SamplingConfig = SamplingConfig()
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    workers: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Gateway processes behind the one listening address. Past 1, a router "
        "process sends every call of a session to the worker that holds its transcript "
        "and fans the admin API out to all of them (each call then costs one local hop).",
    )
    gc_young_threshold: int = Field(
        default=50_000,
        ge=0,
        description="Allocations between young collections of Python's garbage collector "
        "once the gateway has started (start-up's objects are frozen first); 0 keeps "
        "Python's default (700).",
    )

    @model_validator(mode="before")
    @classmethod
    def _capture_by_engine(cls, data: Any) -> Any:
        """The embedded engine takes token ids: its capture is token-in/token-out
        unless the config says otherwise (the file as the flags)."""
        if isinstance(data, dict) and "capture" not in data:
            engine = data.get("engine")
            kind = engine.get("kind") if isinstance(engine, dict) else getattr(engine, "kind", None)
            if kind == "embedded":
                return {**data, "capture": CaptureMode.TOKEN_IN_TOKEN_OUT}
        return data

    @field_validator("engine")
    @classmethod
    def _engine_takes_the_capture(cls, value: EngineConfig, info: ValidationInfo) -> EngineConfig:
        if value.kind == "embedded" and info.data.get("capture") is CaptureMode.ENGINE_RENDERED:
            raise ValueError(
                "the embedded engine takes token ids: use capture: token_in_token_out (its default)"
            )
        return value


def load_gateway_config(path: Path | None, overrides: dict[str, Any]) -> GatewayConfig:
    """Read the YAML file (if any), apply flag overrides, validate once."""
    return load_config(GatewayConfig, path, overrides)
