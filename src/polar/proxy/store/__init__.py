"""Durable storage of sessions and completion records (SQLite, WAL mode)."""

from polar.proxy.store.sqlite import SessionRow, SqliteStore, StoreStats

__all__ = ["SessionRow", "SqliteStore", "StoreStats"]
