"""A scripted inference server for tests: vLLM's wire format, a fixed script of turns.

It tokenizes each scripted assistant turn with the real tokenizer, gives every
token a deterministic logprob, and answers exactly as vLLM does. A request that
does not match the script gets a loud HTTP 500 and is kept in ``failures``.
"""

from polar.proxy.engines.base import SESSION_HEADER
from polar.testing.scripted.script import (
    Expect,
    Script,
    ScriptedCall,
    ScriptError,
    SessionScripts,
    Turn,
    load_script,
    script_from_dict,
)
from polar.testing.scripted.server import ScriptedEngine

__all__ = [
    "SESSION_HEADER",
    "Expect",
    "Script",
    "ScriptError",
    "ScriptedCall",
    "ScriptedEngine",
    "SessionScripts",
    "Turn",
    "load_script",
    "script_from_dict",
]
