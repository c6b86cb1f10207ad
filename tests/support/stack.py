"""A scripted engine and a gateway, both real HTTP servers, for end-to-end tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx
from openai import OpenAI

from polar.ir import CompletionRecord
from polar.proxy.app import create_app
from polar.proxy.call.capture import build_capture
from polar.proxy.config import GatewayConfig, RenderConfig
from polar.proxy.front.httpwire import GatewayHttpProtocol
from polar.proxy.gateway import Gateway
from polar.proxy.render.template import ChatTemplate
from polar.proxy.store import SqliteStore
from polar.serverthread import ServerThread
from polar.testing.scripted import Script, ScriptedEngine, SessionScripts

ADMIN_TOKEN = "test-admin-token-0123456789"

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


class Stack:
    def __init__(
        self,
        root: Path,
        tokenizer: Any,
        script: Script | SessionScripts,
        *,
        wire: str = "vllm",
        token_delay_s: float = 0.0,
        engine_url: str | None = None,
        engine: dict[str, Any] | None = None,
        template: ChatTemplate | None = None,
        **config: Any,
    ) -> None:
        """``template``: a loaded chat template to share, used when the gateway's
        render section is the default one (it names that template)."""
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self._clients: list[OpenAI | anthropic.Anthropic] = []
        self.engine = ScriptedEngine(
            script,
            tokenizer,
            token_delay_s=token_delay_s,
            wire=wire,  # type: ignore[arg-type]
        ).start()
        self.db_path = root / "records.db"
        self.config = GatewayConfig.model_validate(
            {
                "admin_token": ADMIN_TOKEN,
                "engine": {
                    "kind": wire,
                    "base_url": engine_url or self.engine.url,
                    "model": "scripted",
                    "retry_backoff_s": 0.01,
                    **(engine or {}),
                },
                "store": {"path": str(self.db_path)},
                **config,
            }
        )
        self._template = template if self.config.render == RenderConfig() else None
        self.start_gateway()

    def start_gateway(self) -> None:
        capture = build_capture(self.config, template=self._template)
        self.gateway = Gateway(self.config, capture=capture)
        # The gateway's own HTTP server, as `polar gateway` runs it.
        self.server = ServerThread(create_app(self.gateway), http=GatewayHttpProtocol).start()
        self.url = self.server.url

    def stop_gateway(self) -> None:
        self.server.stop()

    def close(self) -> None:
        for client in self._clients:
            client.close()
        self.server.stop()
        self.engine.stop()

    def admin(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30
        )

    def new_session(self, **metadata: Any) -> tuple[str, str]:
        with self.admin() as admin:
            reply = admin.post("/admin/sessions", json={"metadata": metadata})
        reply.raise_for_status()
        body = reply.json()
        return body["session_id"], body["api_key"]

    def openai(self, api_key: str, **options: Any) -> OpenAI:
        client = OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, **options)
        self._clients.append(client)
        return client

    def anthropic(self, api_key: str) -> anthropic.Anthropic:
        client = anthropic.Anthropic(base_url=self.url, api_key=api_key, max_retries=0)
        self._clients.append(client)
        return client

    def client(self, api_key: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"authorization": f"Bearer {api_key}"}, timeout=30
        )

    def records(self, session_id: str) -> list[CompletionRecord]:
        return SqliteStore(self.db_path).records(session_id)
