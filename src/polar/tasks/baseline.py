"""The workspace baseline: what "the agent's changes" are measured against.

After the set-up commands ran, :func:`record_baseline_argv` snapshots the
workspace (tracked and untracked files, minus ``.gitignore``'d ones and
Python caches) as a commit under :data:`BASELINE_REF`, without touching
``HEAD``, the index, or the files: the agent sees the repository exactly as
it was prepared. Evaluators later diff the workspace against that commit
(:mod:`polar.reward.patches`), so files created by set-up never count as the
agent's, and files the agent created or committed do.

The scripts are POSIX ``sh`` and run inside the runtime, so they work the same
for a copied directory, a checkout, and a repository inside an image. Every
git call sets what it needs per command (``-c``); nobody's git config is
written.
"""

from __future__ import annotations

from dataclasses import dataclass

BASELINE_REF = "refs/polar/baseline"
CACHE_EXCLUDES = ("**/__pycache__/**", "**/*.pyc", "**/.pytest_cache/**")
"""Never part of a snapshot or a diff (as git pathspec globs)."""
NO_GIT_EXIT = 90
"""Exit status of a script when the runtime has no ``git``."""
NO_BASELINE_EXIT = 91
"""Exit status of a script when the workspace has no baseline commit."""

IDENTITY = ("-c", "user.name=Polar", "-c", "user.email=polar@localhost")

PREAMBLE = f"""set -eu
command -v git >/dev/null 2>&1 || {{
  echo "git is not installed in the runtime" >&2
  exit {NO_GIT_EXIT}
}}
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_NO_REPLACE_OBJECTS=1
g() {{ git -c 'safe.directory=*' -c core.hooksPath=/dev/null -c core.autocrlf=false \\
  -c core.fsmonitor=false -c user.name=Polar -c user.email=polar@localhost \\
  -c commit.gpgsign=false "$@"; }}
"""
"""Shell prelude of every in-runtime git script: ``g`` is git with fixed settings,
no system or user config, no replace refs, no hooks or fsmonitor commands."""

EXCLUDE_PATHSPECS = " ".join(f"':(exclude,glob){pattern}'" for pattern in CACHE_EXCLUDES)

STAGE_ALL = f"g add -A -- . {EXCLUDE_PATHSPECS}"
"""Stage every file of the work tree except caches (into ``$GIT_INDEX_FILE``)."""

_RECORD = f"""{PREAMBLE}
[ -e .git ] || g -c init.defaultBranch=main init -q
export GIT_INDEX_FILE="$(g rev-parse --absolute-git-dir)/polar-baseline-index"
rm -f "$GIT_INDEX_FILE"
parent=""
if g rev-parse -q --verify HEAD >/dev/null; then
  g read-tree HEAD
  parent="-p HEAD"
fi
{STAGE_ALL}
tree=$(g write-tree)
commit=$(g commit-tree "$tree" $parent -m "polar baseline")
g update-ref {BASELINE_REF} "$commit"
rm -f "$GIT_INDEX_FILE"
echo "$commit"
cat "$(g rev-parse --absolute-git-dir)/config"
"""


@dataclass(frozen=True, slots=True)
class Baseline:
    """What the node keeps of a workspace's baseline, out of the agent's reach:
    its commit and the repository's ``.git/config`` as set-up left them.
    Evaluators put both back before they run git in the agent's workspace (an
    agent may move the ref, or write commands into the config: ``core.fsmonitor``,
    filters, ``core.sshCommand``)."""

    commit: str
    git_config: str


def record_baseline_argv() -> list[str]:
    """Run in the workspace: make it a repository if needed, record the baseline,
    print its commit id, then the repository's config."""
    return ["sh", "-c", _RECORD, "polar-baseline"]


def parse_baseline(stdout: str) -> Baseline:
    commit, _, config = stdout.partition("\n")
    return Baseline(commit.strip(), config)
