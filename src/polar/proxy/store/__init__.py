"""Durable storage of sessions and completion records (SQLite, WAL mode)."""

from polar.proxy.store.sqlite import SessionRow, SqliteStore, StoreError, StoreState, StoreStats

__all__ = ["SessionRow", "SqliteStore", "StoreError", "StoreState", "StoreStats"]
