"""The rollout server keeps its nodes in its store: a restarted server knows them (where
they are, their capacity, which are draining) before they beat again, and forgets a node
only when it is declared lost. Real HTTP servers; no node process (the node's side of the
protocol is spoken with plain requests)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from polar.rollout.config import ServerConfig
from polar.rollout.server.app import create_server_app
from polar.rollout.server.service import RolloutServer
from polar.serverthread import ServerThread

from support.rollout import CONTROL_TOKEN
from support.waiting import wait_until

AUTH = {"authorization": f"Bearer {CONTROL_TOKEN}"}


@contextmanager
def serving(db: Path, node_timeout_s: float = 30.0) -> Iterator[httpx.Client]:
    config = ServerConfig(port=0, db=db, control_token=CONTROL_TOKEN, node_timeout_s=node_timeout_s)
    server = RolloutServer(config)
    with ServerThread(create_server_app(server)) as thread:
        server.public_url = thread.url
        with httpx.Client(base_url=thread.url, headers=AUTH, timeout=30) as http:
            yield http


def test_a_restarted_server_knows_its_nodes_and_which_are_draining(tmp_path: Path) -> None:
    db = tmp_path / "rollout.db"
    with serving(db) as http:
        for node_id, port in (("node-a", 9101), ("node-b", 9102)):
            registration = {
                "node_id": node_id,
                "url": f"http://10.0.0.7:{port}",
                "capacity": {"run": 3, "ahead": 1},
            }
            assert http.post("/nodes/register", json=registration).status_code == 200
        assert http.post("/nodes/node-b/drain", json={"draining": True}).status_code == 200
        before = http.get("/nodes").json()

    with serving(db) as http:
        after = http.get("/nodes").json()
        # Known at once, with what was registered and decided; no re-registration needed.
        assert [(n["node_id"], n["url"], n["draining"]) for n in after] == [
            ("node-a", "http://10.0.0.7:9101", False),
            ("node-b", "http://10.0.0.7:9102", True),
        ]
        assert [n["capacity"] for n in after] == [n["capacity"] for n in before]
        assert all(n["healthy"] for n in after)
        beat = http.post("/nodes/node-a/heartbeat", json={"sessions": {}})
        assert beat.status_code == 200, beat.text


def test_a_node_declared_lost_is_forgotten_across_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "rollout.db"
    with serving(db, node_timeout_s=0.3) as http:
        registration = {"node_id": "gone", "url": "http://10.0.0.7:9101"}
        assert http.post("/nodes/register", json=registration).status_code == 200
        wait_until(lambda: http.get("/nodes").json() == [], timeout_s=30, what="node lost")
    with serving(db) as http:
        assert http.get("/nodes").json() == []
        assert http.post("/nodes/gone/heartbeat", json={"sessions": {}}).status_code == 404


def test_a_node_silent_across_a_restart_is_not_called_healthy(tmp_path: Path) -> None:
    db = tmp_path / "rollout.db"
    with serving(db) as http:
        registration = {"node_id": "quiet", "url": "http://10.0.0.7:9101"}
        assert http.post("/nodes/register", json=registration).status_code == 200
    time.sleep(2.3)  # longer than the next server's node_timeout_s
    with serving(db, node_timeout_s=2.0) as http:
        (node,) = http.get("/nodes").json()
        assert node["node_id"] == "quiet" and not node["healthy"]
