"""Each preset's configuration files and command line, without running the CLI."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from polar.harness import (
    PRESETS,
    Harness,
    InvalidHarnessOptions,
    InvalidRunSpec,
    NpmPackage,
    PythonPackage,
    RunSpec,
    load_harness,
)
from polar.harness.presets.pi import Pi, PiApi
from polar.harness.presets.shell import Shell
from polar.ir import Dialect

EXE = Path("/opt/cli/bin/agent")
GATEWAY = "http://127.0.0.1:8000"

PINNED = {
    "codex": ("@openai/codex", "0.169.0", "codex"),
    "claude_code": ("@anthropic-ai/claude-code", "2.1.331", "claude"),
    "qwen_code": ("@qwen-code/qwen-code", "0.24.4", "qwen"),
    "pi": ("@mariozechner/pi-coding-agent", "0.73.1", "pi"),
    "opencode": ("opencode-ai", "1.18.33", "opencode"),
    "mini_swe_agent": ("mini-swe-agent", "2.4.6", "mini"),
    "gemini_cli": ("@google/gemini-cli", "0.61.0", "gemini"),
}

DIALECTS = {
    "codex": Dialect.OPENAI_RESPONSES,
    "claude_code": Dialect.ANTHROPIC_MESSAGES,
    "qwen_code": Dialect.OPENAI_CHAT,
    "pi": Dialect.OPENAI_CHAT,
    "opencode": Dialect.OPENAI_CHAT,
    "mini_swe_agent": Dialect.OPENAI_CHAT,
    "gemini_cli": Dialect.GEMINI,
}


def preset(name: str) -> Harness:
    return load_harness(name, {"command": "agent {instruction}"} if name == "shell" else None)


def files_under(home: Path) -> dict[str, str]:
    return {
        str(path.relative_to(home)): path.read_text(encoding="utf-8")
        for path in sorted(home.rglob("*"))
        if path.is_file()
    }


# -- the contract every preset keeps ---------------------------------------------------------


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_is_a_harness_with_its_registry_name(name: str) -> None:
    harness = preset(name)
    assert isinstance(harness, Harness)
    assert harness.name == name
    assert isinstance(harness.dialect, Dialect)


@pytest.mark.parametrize("name", list(PINNED))
def test_each_cli_is_pinned_to_an_exact_version(name: str) -> None:
    package = preset(name).package
    assert package is not None
    assert (package.name, package.version, package.bin) == PINNED[name]
    assert re.fullmatch(r"\d+\.\d+\.\d+", package.version)
    assert preset(name).dialect is DIALECTS[name]


def test_npm_and_python_packages_are_told_apart() -> None:
    assert isinstance(preset("codex").package, NpmPackage)
    mini = preset("mini_swe_agent").package
    assert isinstance(mini, PythonPackage)
    assert all("==" in pin for pin in mini.requirements)
    assert preset("shell").package is None


@pytest.mark.parametrize("name", list(PRESETS))
def test_the_api_key_travels_only_in_the_environment(
    name: str, make_spec: Callable[..., RunSpec]
) -> None:
    spec = make_spec()
    harness = preset(name)
    written = harness.write_config(spec)
    invocation = harness.invocation(spec, EXE)

    assert all(path.is_relative_to(spec.home) for path in written)
    for path, text in files_under(spec.home).items():
        assert spec.api_key not in text, f"the key was written to {path}"
    assert not any(spec.api_key in arg for arg in invocation.argv)
    assert spec.api_key in invocation.env.values()
    assert spec.api_key not in repr(spec)


@pytest.mark.parametrize("name", list(PRESETS))
def test_the_instruction_is_one_argument_and_the_run_is_headless(
    name: str, make_spec: Callable[..., RunSpec]
) -> None:
    instruction = "Fix the bug; don't touch $HOME or `tests/`"
    spec = make_spec(instruction=instruction)
    argv = preset(name).invocation(spec, EXE).argv
    assert sum(instruction in arg for arg in argv) == 1


@pytest.mark.parametrize("name", list(PINNED))
def test_a_preset_with_a_package_needs_its_executable(
    name: str, make_spec: Callable[..., RunSpec]
) -> None:
    with pytest.raises(InvalidRunSpec, match="needs its installed executable"):
        preset(name).invocation(make_spec(), None)


# -- codex -----------------------------------------------------------------------------------


def test_codex_config_is_a_responses_provider_with_telemetry_off(
    make_spec: Callable[..., RunSpec],
) -> None:
    spec = make_spec(gateway_url=GATEWAY + "/")
    (path,) = preset("codex").write_config(spec)
    assert path == spec.home / ".codex" / "config.toml"
    config = tomllib.loads(path.read_text())
    assert config["model"] == "policy"
    assert config["model_provider"] == "polar"
    assert config["check_for_update_on_startup"] is False
    assert config["web_search"] == "disabled"
    assert config["model_providers"]["polar"] == {
        "name": "Polar gateway",
        "base_url": f"{GATEWAY}/v1",
        "env_key": "POLAR_API_KEY",
        "wire_api": "responses",
    }
    assert config["analytics"] == {"enabled": False}
    assert config["features"] == {"plugins": False}


def test_codex_model_names_are_escaped_in_toml(make_spec: Callable[..., RunSpec]) -> None:
    spec = make_spec(model='we"ird\\name\n')
    (path,) = preset("codex").write_config(spec)
    assert tomllib.loads(path.read_text())["model"] == 'we"ird\\name\n'


def test_codex_runs_exec_without_its_own_sandbox(make_spec: Callable[..., RunSpec]) -> None:
    spec = make_spec(instruction="-v is not a flag here")
    invocation = preset("codex").invocation(spec, EXE)
    assert invocation.argv == (
        str(EXE), "exec", "--skip-git-repo-check", "-s", "danger-full-access",
        "--", "-v is not a flag here",
    )  # fmt: skip
    assert invocation.env == {
        "CODEX_HOME": str(spec.home / ".codex"),
        "POLAR_API_KEY": spec.api_key,
    }


# -- Claude Code -----------------------------------------------------------------------------


def test_claude_code_is_configured_by_environment(make_spec: Callable[..., RunSpec]) -> None:
    spec = make_spec()
    harness = preset("claude_code")
    assert harness.write_config(spec) == ()
    invocation = harness.invocation(spec, EXE)
    assert invocation.argv == (
        str(EXE), "-p", "--allowedTools", "Bash", "--dangerously-skip-permissions",
        "--", spec.instruction,
    )  # fmt: skip
    env = invocation.env
    assert env["ANTHROPIC_BASE_URL"] == GATEWAY  # the client adds /v1/messages
    assert env["ANTHROPIC_API_KEY"] == spec.api_key
    assert env["ANTHROPIC_MODEL"] == "policy"
    assert env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "policy"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["IS_SANDBOX"] == "1"


# -- Qwen Code -------------------------------------------------------------------------------


def test_qwen_code_settings_turn_off_telemetry_and_the_memory_subagent(
    make_spec: Callable[..., RunSpec],
) -> None:
    spec = make_spec()
    (path,) = preset("qwen_code").write_config(spec)
    assert path == spec.home / ".qwen" / "settings.json"
    settings = json.loads(path.read_text())
    assert settings["privacy"] == {"usageStatisticsEnabled": False}
    assert settings["telemetry"] == {"enabled": False}
    assert settings["general"] == {"enableAutoUpdate": False}
    assert settings["memory"]["enableManagedAutoMemory"] is False
    assert settings["security"] == {"auth": {"selectedType": "openai"}}
    assert settings["model"] == {"name": "policy"}


def test_qwen_code_runs_yolo_with_openai_variables(make_spec: Callable[..., RunSpec]) -> None:
    spec = make_spec()
    invocation = preset("qwen_code").invocation(spec, EXE)
    assert invocation.argv == (str(EXE), "--auth-type", "openai", "--yolo", spec.instruction)
    assert invocation.env == {
        "OPENAI_BASE_URL": f"{GATEWAY}/v1",
        "OPENAI_API_KEY": spec.api_key,
        "OPENAI_MODEL": "policy",
        "QWEN_CODE_DISABLE_PRECONNECT": "1",
    }


def test_qwen_code_takes_a_dash_instruction_as_a_prompt_option(
    make_spec: Callable[..., RunSpec],
) -> None:
    argv = preset("qwen_code").invocation(make_spec(instruction="-x marks"), EXE).argv
    assert argv[-1] == "--prompt=-x marks"


# -- gemini_cli ------------------------------------------------------------------------------


def test_gemini_cli_settings_select_api_key_auth_with_telemetry_off(
    make_spec: Callable[..., RunSpec],
) -> None:
    spec = make_spec()
    (path,) = preset("gemini_cli").write_config(spec)
    assert path == spec.home / ".gemini" / "settings.json"
    assert json.loads(path.read_text()) == {
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "model": {"name": "policy"},
    }
    routed = load_harness("gemini_cli", {"routing": "true"})
    (path,) = routed.write_config(make_spec(home=spec.home / "routed"))
    assert "model" not in json.loads(path.read_text())  # the CLI's own "auto"


def test_gemini_cli_runs_yolo_in_a_trusted_workspace_against_the_gateway(
    make_spec: Callable[..., RunSpec],
) -> None:
    spec = make_spec(instruction="-x marks")
    invocation = preset("gemini_cli").invocation(spec, EXE)
    assert invocation.argv == (str(EXE), "--yolo", "--prompt=-x marks")
    assert invocation.env == {
        "GOOGLE_GEMINI_BASE_URL": GATEWAY,
        "GEMINI_API_KEY": spec.api_key,
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
    }


# -- pi --------------------------------------------------------------------------------------


def test_pi_models_json_names_the_key_variable_not_the_key(
    make_spec: Callable[..., RunSpec],
) -> None:
    spec = make_spec()
    (path,) = preset("pi").write_config(spec)
    assert path == spec.home / ".pi" / "agent" / "models.json"
    provider = json.loads(path.read_text())["providers"]["polar"]
    assert provider["api"] == "openai-completions"
    assert provider["baseUrl"] == f"{GATEWAY}/v1"
    assert provider["apiKey"] == "POLAR_API_KEY"
    assert provider["compat"] == {"supportsDeveloperRole": False, "supportsReasoningEffort": False}
    assert provider["models"] == [
        {"id": "policy", "reasoning": False, "contextWindow": 32768, "maxTokens": 4096}
    ]


def test_pi_runs_print_mode_offline(make_spec: Callable[..., RunSpec]) -> None:
    spec = make_spec()
    invocation = preset("pi").invocation(spec, EXE)
    assert invocation.argv == (
        str(EXE), "-p", "--provider", "polar", "--model", "policy", spec.instruction,
    )  # fmt: skip
    assert invocation.env["PI_OFFLINE"] == "1"
    assert invocation.env["PI_TELEMETRY"] == "0"
    assert invocation.env["PI_SKIP_VERSION_CHECK"] == "1"
    assert invocation.env["PI_CODING_AGENT_DIR"] == str(spec.home / ".pi" / "agent")
    assert invocation.env["POLAR_API_KEY"] == spec.api_key


@pytest.mark.parametrize(
    ("api", "dialect", "base"),
    [
        ("openai-responses", Dialect.OPENAI_RESPONSES, f"{GATEWAY}/v1"),
        ("anthropic-messages", Dialect.ANTHROPIC_MESSAGES, GATEWAY),
    ],
)
def test_pi_can_speak_responses_or_anthropic(
    api: str, dialect: Dialect, base: str, make_spec: Callable[..., RunSpec]
) -> None:
    harness = load_harness("pi", {"api": api, "max_tokens": "8000"})
    assert harness == Pi(api=PiApi(api), max_tokens=8000)
    assert harness.dialect is dialect
    (path,) = harness.write_config(make_spec())
    provider = json.loads(path.read_text())["providers"]["polar"]
    assert (provider["api"], provider["baseUrl"]) == (api, base)
    assert "compat" not in provider
    assert provider["models"][0]["maxTokens"] == 8000


@pytest.mark.parametrize("instruction", ["-v please", "@notes.md summarize"])
def test_pi_refuses_instructions_its_parser_would_misread(
    instruction: str, make_spec: Callable[..., RunSpec]
) -> None:
    with pytest.raises(InvalidRunSpec, match="starting with '-' or '@'"):
        preset("pi").invocation(make_spec(instruction=instruction), EXE)


# -- opencode --------------------------------------------------------------------------------


def test_opencode_config_points_both_models_at_the_gateway(
    make_spec: Callable[..., RunSpec],
) -> None:
    spec = make_spec()
    paths = preset("opencode").write_config(spec)
    config_dir = spec.home / ".config" / "opencode"
    assert config_dir / "opencode.json" in paths
    config = json.loads((config_dir / "opencode.json").read_text())
    provider = config["provider"]["polar"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": f"{GATEWAY}/v1", "apiKey": "{env:POLAR_API_KEY}"}
    assert provider["models"] == {"policy": {"name": "policy"}}
    assert config["model"] == config["small_model"] == "polar/policy"
    assert config["autoupdate"] is False


def test_opencode_config_dir_already_lists_its_plugin_package(
    make_spec: Callable[..., RunSpec],
) -> None:
    spec = make_spec()
    preset("opencode").write_config(spec)
    config_dir = spec.home / ".config" / "opencode"
    lock = json.loads((config_dir / "package-lock.json").read_text())
    assert lock["packages"][""]["dependencies"] == {"@opencode-ai/plugin": "1.18.33"}
    assert (config_dir / "node_modules").is_dir()


def test_opencode_runs_with_every_lookup_switched_off(make_spec: Callable[..., RunSpec]) -> None:
    spec = make_spec()
    invocation = preset("opencode").invocation(spec, EXE)
    assert invocation.argv == (str(EXE), "run", "--", spec.instruction)
    for switch in (
        "OPENCODE_DISABLE_MODELS_FETCH",
        "OPENCODE_DISABLE_AUTOUPDATE",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS",
        "OPENCODE_DISABLE_LSP_DOWNLOAD",
        "OPENCODE_DISABLE_SHARE",
        "OPENCODE_DISABLE_CLAUDE_CODE",
    ):
        assert invocation.env[switch] == "1"
    assert invocation.env["POLAR_API_KEY"] == spec.api_key


def test_opencode_without_title_call_names_the_session_itself(
    make_spec: Callable[..., RunSpec],
) -> None:
    spec = make_spec(instruction="Fix the parser\nthen run the tests")
    harness = load_harness("opencode", {"title_call": "false"})
    argv = harness.invocation(spec, EXE).argv
    assert argv == (str(EXE), "run", "--title=Fix the parser", "--", spec.instruction)


# -- mini-swe-agent --------------------------------------------------------------------------


def test_mini_swe_agent_config_uses_litellm_against_the_gateway(
    make_spec: Callable[..., RunSpec],
) -> None:
    spec = make_spec()
    (path,) = preset("mini_swe_agent").write_config(spec)
    assert path.suffix == ".yaml"
    config = yaml.safe_load(path.read_text())
    assert config["model"] == {
        "model_class": "litellm",
        "model_name": "openai/policy",
        "cost_tracking": "ignore_errors",
        "model_kwargs": {"api_base": f"{GATEWAY}/v1", "drop_params": True},
    }
    assert config["agent"] == {"step_limit": 0, "cost_limit": 0}
    assert config["environment"] == {"environment_class": "local", "timeout": 60}


def test_mini_swe_agent_runs_yolo_without_setup_or_cost_map_downloads(
    make_spec: Callable[..., RunSpec],
) -> None:
    spec = make_spec(instruction="-fix it")
    harness = preset("mini_swe_agent")
    invocation = harness.invocation(spec, EXE)
    config = spec.home / ".config" / "mini-swe-agent" / "polar.yaml"
    assert invocation.argv == (
        str(EXE), "--yolo", "--exit-immediately", "-c", "mini.yaml", "-c", str(config),
        "--task=-fix it",
    )  # fmt: skip
    env = invocation.env
    assert env["OPENAI_API_KEY"] == spec.api_key
    assert env["MSWEA_CONFIGURED"] == "true"
    assert env["MSWEA_GLOBAL_CONFIG_DIR"] == str(config.parent)
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert env["MSWEA_COST_TRACKING"] == "ignore_errors"


# -- shell -----------------------------------------------------------------------------------


def test_shell_substitutes_the_instruction_into_single_arguments(
    make_spec: Callable[..., RunSpec],
) -> None:
    spec = make_spec(instruction='say "hi" && $(rm -rf /)\'')
    harness = Shell(command="my-agent --task {instruction} --tag 'x {instruction} y'")
    invocation = harness.invocation(spec, None)
    assert invocation.argv == (
        "my-agent", "--task", spec.instruction, "--tag", f"x {spec.instruction} y",
    )  # fmt: skip


def test_shell_gets_both_providers_variables(make_spec: Callable[..., RunSpec]) -> None:
    spec = make_spec()
    env = Shell(command="agent").invocation(spec, None).env
    assert env == {
        "OPENAI_BASE_URL": f"{GATEWAY}/v1",
        "OPENAI_API_KEY": spec.api_key,
        "OPENAI_MODEL": "policy",
        "ANTHROPIC_BASE_URL": GATEWAY,
        "ANTHROPIC_API_KEY": spec.api_key,
        "ANTHROPIC_MODEL": "policy",
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [({}, "needs a command"), ({"command": "agent 'unclosed"}, "command: No closing quotation")],
)
def test_shell_without_a_usable_command_is_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidHarnessOptions, match=message):
        load_harness("shell", options)


def test_shell_dialect_is_a_setting() -> None:
    harness = load_harness("shell", {"command": "agent", "dialect": "anthropic_messages"})
    assert harness.dialect is Dialect.ANTHROPIC_MESSAGES
