"""Packed token ids, prefix lengths and content-addressed request bodies."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polar.ir.tokenids import PromptIdList, TokenRun, common_prefix, pack
from polar.proxy.store.packing import (
    blob_key,
    decode_blob,
    encode_blob,
    join_body,
    split_body,
)
from polar.proxy.store.writer import DeltaBases

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=200),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)


@given(st.dictionaries(st.text(max_size=12), json_values, max_size=8))
def test_split_and_join_restore_any_body(body: dict[str, Any]) -> None:
    skeleton, blobs, _ = split_body(body)
    store = dict(blobs)
    doc = orjson.loads(skeleton)
    listed = {field for field, kind, _ in doc["refs"] if kind == "list"}
    # Non-empty lists leave the skeleton: only a reference to their chain stays.
    assert listed == {k for k, v in body.items() if isinstance(v, list) and v}
    assert all(doc["body"][field] is None for field in listed)
    assert join_body(skeleton, store.__getitem__) == body


def test_client_data_that_looks_like_a_reference_is_not_misread() -> None:
    body = {"messages": [{"$blob": "00" * 32}, {"role": "user", "content": "x" * 500}]}
    skeleton, blobs, _ = split_body(body)
    store = dict(blobs)
    assert join_body(skeleton, store.__getitem__) == body


def test_a_grown_conversation_adds_only_its_new_messages() -> None:
    history = [{"role": "user", "content": f"message {i} " + "x" * 200} for i in range(100)]
    skeleton_99, first, _ = split_body({"messages": history[:99]})
    skeleton_100, second, _ = split_body({"messages": history})
    new = {key for key, _ in second} - {key for key, _ in first}
    assert len(new) == 2  # one chain node and the message itself
    assert len(skeleton_100) == len(skeleton_99), "the skeleton does not grow with the history"


def test_content_keys_are_content_hashes() -> None:
    big = {"role": "user", "content": "y" * 500}
    _, blobs, _ = split_body({"messages": [big]})
    assert (blob_key(b'{"role":"user","content":"' + b"y" * 500 + b'"}'), None) in [
        (key, None) for key, _ in blobs
    ]


@given(st.binary(max_size=5000))
def test_blob_encoding_round_trips(data: bytes) -> None:
    assert decode_blob(encode_blob(data)) == data


def test_a_token_engine_prompt_is_stored_once_with_the_record() -> None:
    prompt = tuple(range(1000, 21000))
    body = {"model": "m", "prompt": list(prompt), "max_tokens": 16, "stop_token_ids": [151645]}
    skeleton, blobs, _ = split_body(body, prompt=pack(prompt))
    # The prompt list is a reference to the record's packed prompt, not 20k nodes.
    assert len(blobs) == 1 and len(skeleton) < 300
    assert join_body(skeleton, dict(blobs).__getitem__, prompt) == body
    # A list that only looks like the prompt (not ints, or another length) is stored.
    other = {
        "prompt": [float(t) for t in prompt[:3]],
        "flags": [True, *prompt[1:3]],
        "ids": list(prompt[:-1]),
    }
    ones = (1, *prompt[1:3])  # what [True, ...] packs to
    skeleton, blobs, _ = split_body(other, prompt=pack(ones))
    assert join_body(skeleton, dict(blobs).__getitem__, ones)["flags"][0] is True
    skeleton, blobs, _ = split_body(other, prompt=pack(prompt[:3]))
    joined = join_body(skeleton, dict(blobs).__getitem__, prompt[:3])
    assert joined == other
    assert all(type(v) is float for v in joined["prompt"])
    assert joined["flags"][0] is True


def test_the_gateways_own_prompt_list_is_recognised_without_comparing_ids() -> None:
    prompt = tuple(range(1000, 21000))
    body = {"model": "m", "prompt": PromptIdList(prompt), "max_tokens": 16}
    skeleton, blobs, _ = split_body(body, prompt=pack(prompt))
    assert len(blobs) == 0 and b'"prompt_ids"' in skeleton
    assert join_body(skeleton, dict(blobs).__getitem__, prompt) == {**body, "prompt": list(prompt)}
    # Of another length it is not the prompt: stored as any list.
    skeleton, blobs, _ = split_body(body, prompt=pack(prompt[:-1]))
    assert b'"prompt_ids"' not in skeleton
    assert join_body(skeleton, dict(blobs).__getitem__, prompt[:-1]) == body


@pytest.mark.parametrize("seed", range(6))
def test_the_delta_base_is_the_newest_string_sharing_the_most(seed: int) -> None:
    """DeltaBases.best skips strings that cannot share more than the best so far
    (newest first); it still finds what comparing every string finds: the longest
    shared prefix, the newest string among those that tie."""
    rng = random.Random(seed)
    for case in range(60):
        bases = DeltaBases(per_session=8, byte_budget=1 << 20)
        stem = [rng.randint(0, 9) for _ in range(rng.randint(0, 12))]
        added = []
        for rowid in range(rng.randint(0, 10)):
            ids = stem[: rng.randint(0, len(stem))] + [rng.randint(0, 3) for _ in range(3)]
            bases.add("s", rowid, TokenRun.of(pack(ids)))
            added = [*added, (rowid, ids)][-8:]
        prompt = pack([*stem[: rng.randint(0, len(stem))], rng.randint(0, 3)])
        expected: tuple[int | None, int] = (None, 0)
        for rowid, ids in reversed(added):
            shared = common_prefix(pack(ids), prompt)
            if shared > expected[1]:
                expected = (rowid, shared)
        assert bases.best("s", prompt) == expected, f"seed {seed} case {case}"
