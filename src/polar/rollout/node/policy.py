"""What a dispatched session may ask of the node that runs it.

A submission travels whole from the submitter to the node: the task (with its
own ``runtime`` settings), the harness, the builder, the evaluator. Each of
these can loosen the sandbox or run code on the node's host (a plug-in named
``package.module:factory`` is imported and called there; a backend option can
name the program that builds the sandbox). So the node checks every dispatch
against its operator's :class:`~polar.rollout.config.RuntimePolicy` and
:class:`~polar.rollout.config.SandboxLimits` before anything runs, and refuses
it (403, with the reason) when it asks for more:

- a plug-in not listed in ``policy.plugins``;
- a backend other than the node's own or those in ``policy.backends``;
- ``sandbox: false``, ``network: host``, host ``mounts``, backend ``options``
  beyond what the policy allows; ``owner`` (the node's; ``writable_root`` is
  set by the node from the task's workspace kind, whatever the task says);
- a limit above the node's (a task cannot lift one: leaving a limit out, or
  setting it to null, keeps the node's);
- a ``result_url`` outside the node's rollout server (the node would send its
  token there).
"""

from __future__ import annotations

from polar.rollout.config import LIMIT_FIELDS, NodeConfig
from polar.rollout.protocol import SessionDispatch
from polar.runtime.base import NetworkPolicy, RuntimeSpec


class PolicyViolation(Exception):
    """The dispatch asks for something this node's operator did not allow."""


def check_dispatch(dispatch: SessionDispatch, config: NodeConfig) -> None:
    """Raise :class:`PolicyViolation` naming the first thing ``d`` may not do here."""
    policy = config.policy
    named = {
        "harness": dispatch.harness.name,
        "builder": dispatch.builder,
        "evaluator": dispatch.task.evaluator.kind,
    }
    if dispatch.task.runtime is not None:
        named["runtime backend"] = dispatch.task.runtime.backend
    for what, name in named.items():
        if ":" in name and name not in policy.plugins:
            raise PolicyViolation(
                f"{what} plug-in {name} is not allowed on node {config.node_id} "
                "(the node's policy.plugins lists those it may load)"
            )
    if dispatch.task.runtime is not None:
        check_runtime(dispatch.task.runtime, config)
    if dispatch.result_url is not None:
        server = (config.server_url or "").rstrip("/")
        if not server or not dispatch.result_url.startswith(server + "/"):
            raise PolicyViolation(
                f"result_url {dispatch.result_url} is not on this node's rollout server "
                f"({server or 'none'})"
            )


def check_runtime(own: RuntimeSpec, config: NodeConfig) -> None:
    """The settings a task's runtime spec sets itself, against the node's policy."""
    policy = config.policy
    fields = own.asked()
    other_backend = "backend" in fields and own.backend != config.runtime.backend
    if other_backend and own.backend not in policy.backends:
        raise PolicyViolation(f"the task asks for the {own.backend} runtime, not allowed here")
    if "sandbox" in fields and not own.sandbox and not policy.allow_unsandboxed:
        raise PolicyViolation("the task asks for sandbox: false, not allowed here")
    host_network = "network" in fields and own.network is NetworkPolicy.HOST
    if host_network and not policy.allow_host_network:
        raise PolicyViolation("the task asks for network: host, not allowed here")
    if "mounts" in fields and own.mounts and not policy.allow_task_mounts:
        raise PolicyViolation("the task asks to mount host paths, not allowed here")
    extra = sorted(set(own.options) - set(policy.task_options)) if "options" in fields else []
    if extra:
        raise PolicyViolation(f"the task sets runtime options {extra}, not allowed here")
    if "owner" in fields:
        raise PolicyViolation("runtime.owner is the node's to set, not the task's")
    limits = config.limits
    for name in sorted(LIMIT_FIELDS & fields):
        asked = getattr(own, name)
        allowed = getattr(limits, name)
        if allowed is not None and asked > allowed:
            shown = f"{asked:g}"
            raise PolicyViolation(
                f"the task asks for runtime.{name} {shown}; this node allows at most {allowed:g}"
            )
