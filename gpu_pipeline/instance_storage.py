"""Dagster instance storage on SQLite that keeps its database connections open.

Dagster's own SQLite event log (``SqliteEventLogStorage``) creates a new SQLAlchemy engine for every
event it stores, opens a connection, commits and closes it, and disposes of the engine. Every
materialization of every partition is such an event, and an asset event is written twice (the
run's database and the cross-run index). On a two-core machine that came to 12-16 ms an event: a
new engine has an empty statement cache, so each insert is compiled again, and closing the last
connection to a database in WAL mode checkpoints its log. Each asset event also made one more
engine, to check that the index has its tag table.

:class:`PooledSqliteStorage` is Dagster's SQLite storage (the same files, the same layout under
``base_dir``, the same schema) with an event log that keeps one engine per database file: the
index and the most recently used run databases, at most ``max_open_databases`` (default 8) of
them, the least recently used disposed first. Connections stay open between events in a pool; a
forked child drops its parent's connections without closing them. A table of the index, once
found, is remembered (migrations only add tables). Nothing else changes: every
event is still its own transaction, committed before Dagster goes on. It is named in the instance
template, ``dagster.yaml``:

.. code-block:: yaml

    storage:
      custom:
        module: gpu_pipeline.instance_storage
        class: PooledSqliteStorage
        config:
          base_dir: {env: DAGSTER_HOME}
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from dagster import Field, IntSource, StringSource
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._core.storage.sqlite_storage import DagsterSqliteStorage, _event_logs_directory
from dagster._serdes import ConfigurableClassData
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection, Engine

DEFAULT_MAX_OPEN_DATABASES = 8


class PooledSqliteEventLogStorage(SqliteEventLogStorage):
    """``SqliteEventLogStorage`` with one engine (and its open connections) per database file."""

    def __init__(
        self,
        base_dir: str,
        inst_data: ConfigurableClassData | None = None,
        max_open_databases: int = DEFAULT_MAX_OPEN_DATABASES,
    ) -> None:
        if max_open_databases < 1:
            raise ValueError(f"max_open_databases must be at least 1, not {max_open_databases}")
        self._max_open = max_open_databases
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._engines_pid = os.getpid()
        self._tables_found: set[str] = set()
        super().__init__(base_dir, inst_data=inst_data)

    def has_table(self, table_name: str) -> bool:
        """Whether the index has the table. Dagster's own opens a new engine for every call (one per
        asset event stored); a table once found is remembered, as migrations only add tables."""
        if table_name in self._tables_found:
            return True
        found = super().has_table(table_name)
        if found:
            self._tables_found.add(table_name)
        return found

    def open_databases(self) -> list[str]:
        """The shards (run ids, and ``index``) whose engines are open, least recently used first."""
        return list(self._engines)

    def _own_engines(self) -> OrderedDict[str, Engine]:
        """This process's engines (call under ``self._db_lock``): a forked child drops its parent's,
        whose SQLite connections it must neither use nor close."""
        if self._engines_pid != os.getpid():
            for engine in self._engines.values():
                engine.dispose(close=False)
            self._engines.clear()
            self._engines_pid = os.getpid()
        return self._engines

    def _engine(self, shard: str) -> Engine:
        """The shard's engine, made the most recently used; called under ``self._db_lock``."""
        engine = self._own_engines().pop(shard, None)
        if engine is None:
            engine = create_engine(
                self.conn_string_for_shard(shard),
                connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS},
            )
        self._engines[shard] = engine
        while len(self._engines) > self._max_open:
            _, oldest = self._engines.popitem(last=False)
            oldest.dispose()
        return engine

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        with self._db_lock:
            engine = self._engine(shard)
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    def _dispose_engines(self) -> None:
        with self._db_lock:
            engines = list(self._own_engines().values())
            self._engines.clear()
        for engine in engines:
            engine.dispose()

    def wipe(self) -> None:
        # The run databases' files are deleted: their connections must not outlive them.
        self._dispose_engines()
        self._tables_found.clear()
        super().wipe()

    def upgrade(self) -> None:
        super().upgrade()
        self._dispose_engines()

    def dispose(self) -> None:
        self._dispose_engines()
        super().dispose()


class PooledSqliteStorage(DagsterSqliteStorage):
    """Dagster's SQLite storage with :class:`PooledSqliteEventLogStorage` as its event log."""

    def __init__(
        self,
        base_dir: str,
        inst_data: ConfigurableClassData | None = None,
        max_open_databases: int = DEFAULT_MAX_OPEN_DATABASES,
    ) -> None:
        super().__init__(base_dir, inst_data=inst_data)
        # The parent built Dagster's event log on the same directory; it holds no open connection.
        self._event_log_storage.dispose()
        self._event_log_storage = PooledSqliteEventLogStorage(
            _event_logs_directory(base_dir), max_open_databases=max_open_databases
        )

    @classmethod
    def config_type(cls) -> Mapping[str, Any]:
        return {
            "base_dir": StringSource,
            "max_open_databases": Field(IntSource, is_required=False,
                                        default_value=DEFAULT_MAX_OPEN_DATABASES),
        }

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]
    ) -> PooledSqliteStorage:
        os.makedirs(config_value["base_dir"], exist_ok=True)
        return cls(inst_data=inst_data, **config_value)
