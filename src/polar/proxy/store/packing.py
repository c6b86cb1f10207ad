"""Compact encodings that keep a session's storage linear in what is new.

Harnesses resend the whole conversation on every call, so storing each request
and each prompt in full grows with the square of the session length. Two
encodings avoid that:

* token ids are packed (:mod:`polar.ir.tokenids`) and a prompt is stored as a
  *delta* on an earlier record of the same session: ``(base, shared, tail)``
  means "the first ``shared`` tokens of the base record's prompt + output,
  then ``tail``";
* request bodies are split into a *skeleton* plus content-addressed *blobs*:
  top-level lists (messages, tools, input items) become hash chains, so a
  resent conversation prefix costs nothing, and each large top-level value is
  stored once per distinct content.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from polar.ir.tokenids import WIDTH, PromptIdList, pack

# Elements smaller than this stay inline in the skeleton: a blob reference costs ~40 bytes.
MIN_BLOB_BYTES = 96
# Blobs at least this big are zlib-compressed.
COMPRESS_BYTES = 512


def blob_key(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def encode_blob(data: bytes) -> bytes:
    """Stored form of a blob: one flag byte, then raw or zlib-compressed bytes."""
    if len(data) >= COMPRESS_BYTES:
        return b"z" + zlib.compress(data, 1)
    return b"r" + data


def decode_blob(stored: bytes) -> bytes:
    flag, body = stored[:1], stored[1:]
    if flag == b"z":
        return zlib.decompress(body)
    if flag == b"r":
        return body
    raise ValueError(f"corrupt blob: unknown flag {flag!r}")


_ROOT = bytes(32)


def _chain_key(previous: bytes, element_digest: bytes) -> bytes:
    return hashlib.sha256(b"list" + previous + element_digest).digest()


ListMemo = dict[str, tuple[list[bytes], list[bytes]]]
"""Per top-level field: the digests of an earlier body's serialised items and
their chain keys (digests, not the items: a memo costs 64 bytes per item, not
a copy of the conversation)."""


def split_body(
    body: Mapping[str, Any],
    memo: ListMemo | None = None,
    prompt: bytes | None = None,
) -> tuple[bytes, list[tuple[bytes, bytes]], ListMemo]:
    """Split a JSON object into a skeleton and ``(key, bytes)`` blobs.

    Each top-level list is stored as a hash chain: node ``i`` has the key
    ``sha256(node[i-1] + sha256(element i))`` and holds the previous key and the
    element (inline when small, else by its own key). A conversation that grew
    by two messages therefore adds two nodes, and the skeleton refers to the
    whole list by its last key, whatever its length. Large scalar fields are
    stored as single blobs.

    ``memo`` (the third value returned for an earlier body of the same stream
    of requests, whose blobs are stored) lets a resent prefix be recognised by
    the digests of its bytes instead of being chained and stored again; blobs
    of that prefix are not returned again. (Bytes, not ``==``: ``1 == 1.0 ==
    True`` in Python.)

    A top-level list of the ids packed in ``prompt`` (a token engine's prompt,
    which the record stores packed already) is not stored again: its ref has kind
    ``"prompt_ids"`` and :func:`join_body` puts the record's prompt back.

    The skeleton is ``{"body": <object with those fields set to null>,
    "refs": [[field, kind, hex_key], ...]}`` (kind ``"list"``, ``"value"`` or
    ``"prompt_ids"``); positions are explicit so client data can never be
    misread as a reference.
    """
    skeleton: dict[str, Any] = {}
    refs: list[list[Any]] = []
    blobs: list[tuple[bytes, bytes]] = []
    lists: ListMemo = {}
    for field, value in body.items():
        if prompt and _is_prompt(value, prompt):
            refs.append([field, "prompt_ids", ""])
            skeleton[field] = None
            continue
        if isinstance(value, list) and value:
            old_items, old_keys = (memo or {}).get(field, ((), ()))
            items: list[bytes] = []
            keys: list[bytes] = []
            head = _ROOT
            reusing = True
            for i, item in enumerate(value):
                data = orjson.dumps(item)
                digest = blob_key(data)
                items.append(digest)
                if reusing and i < len(old_items) and old_items[i] == digest:
                    head = old_keys[i]
                    keys.append(head)
                    continue
                reusing = False
                key = _chain_key(head, digest)
                if len(data) >= MIN_BLOB_BYTES:
                    blobs.append((digest, data))
                    node = head + b"k" + digest
                else:
                    node = head + b"j" + data
                blobs.append((key, node))
                keys.append(key)
                head = key
            lists[field] = (items, keys)
            refs.append([field, "list", head.hex()])
            skeleton[field] = None
            continue
        data = orjson.dumps(value)
        if len(data) >= MIN_BLOB_BYTES * 4:
            key = blob_key(data)
            blobs.append((key, data))
            refs.append([field, "value", key.hex()])
            skeleton[field] = None
        else:
            skeleton[field] = value
    return orjson.dumps({"body": skeleton, "refs": refs}), blobs, lists


def _is_prompt(value: Any, prompt: bytes) -> bool:
    """Whether ``value`` is exactly the packed ids: a :class:`PromptIdList` of
    their length, or else the same ints, none a ``bool`` or a float (checked in
    C: a prompt has tens of thousands)."""
    if not isinstance(value, list) or len(value) * WIDTH != len(prompt):
        return False
    if type(value) is PromptIdList:  # the gateway built it from this very prompt
        return True
    try:
        same = pack(value) == prompt
    except (TypeError, OverflowError):
        return False
    return same and {*map(type, value)} <= {int}


def join_body(
    skeleton: bytes,
    load_blob: Callable[[bytes], bytes],
    prompt_ids: tuple[int, ...] = (),
) -> dict[str, Any]:
    """Inverse of :func:`split_body`. ``load_blob(key)`` returns a blob's bytes;
    ``prompt_ids`` is the record's prompt (for ``"prompt_ids"`` refs)."""
    doc = orjson.loads(skeleton)
    body: dict[str, Any] = doc["body"]
    for field, kind, hex_key in doc["refs"]:
        if kind == "prompt_ids":
            body[field] = list(prompt_ids)
            continue
        key = bytes.fromhex(hex_key)
        if kind == "value":
            body[field] = orjson.loads(load_blob(key))
            continue
        items: list[Any] = []
        while key != _ROOT:
            node = load_blob(key)
            key, tag, payload = node[:32], node[32:33], node[33:]
            items.append(orjson.loads(load_blob(payload) if tag == b"k" else payload))
        items.reverse()
        body[field] = items
    return body
