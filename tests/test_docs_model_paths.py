"""The README and docs/ name a local model by the directory the command that
builds it writes (``polar model init``, ``warm-up``, ``smollm2``), never another."""

from __future__ import annotations

import re
from pathlib import Path

from polar.cli.model import AGENTS_MODEL_DIR, DEFAULT_MODEL_DIR
from polar.smollm2 import DEFAULT_DIR as SMOLLM2_DIR

ROOT = Path(__file__).resolve().parents[1]
MODEL_PATH = re.compile(
    r"(?:\.cache|runs)/(?:models?/)?(?:tiny|smollm)[A-Za-z0-9._-]*|models/tiny\b"
)


def test_every_local_model_path_in_the_docs_is_one_a_command_builds() -> None:
    built = {str(DEFAULT_MODEL_DIR), str(AGENTS_MODEL_DIR), str(SMOLLM2_DIR)}
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    named = {
        (doc.relative_to(ROOT).as_posix(), path)
        for doc in docs
        for path in MODEL_PATH.findall(doc.read_text(encoding="utf-8"))
    }
    assert named  # the pattern still finds them
    assert {(doc, path) for doc, path in named if path not in built} == set()
