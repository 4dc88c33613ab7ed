"""The SQLite schema: every table the product uses, applied as numbered migrations.

Conventions (the PostgreSQL schema mirrors them):
- Timestamps are REAL unix seconds (UTC); the store converts to aware datetimes.
- Every row carries `user_id`; item ids (messages, entities, ...) are unique per user, so
  an import into another user never collides and a lookup always names its user.
- `agent_id` NULL means "no agent". Reads filter on it with `IS ?` under agent isolation.
- Full-text tables are FTS5 *external content* tables over a `*terms` column of the source
  row (the text from `proxy.terms.index_text`, already stemmed and lower-cased), kept in
  step by triggers, so every insert, update and delete path - FK cascades included -
  updates the index. A delete leaves tombstones until the index is merged: after deleting
  a user run `INSERT INTO <t>_fts(<t>_fts) VALUES('optimize')` (or 'rebuild') per table.
- Deleting a user row cascades through every table (foreign keys, `foreign_keys=ON`).
"""

from __future__ import annotations

import re
import sqlite3
import time

from proxy.extracted import KEY_MAX_CHARS, bounded_key

# `_` is a token character so identifier terms (`internal_hbr_2291_example`) stay whole.
_TOKENIZE = "tokenize = \"unicode61 tokenchars '_'\""

_V1_TABLES = """
CREATE TABLE users (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL
);

CREATE TABLE conversations (
    user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    agent_id TEXT,
    created_at REAL NOT NULL,
    last_active_at REAL NOT NULL,
    PRIMARY KEY (user_id, id)
);
CREATE INDEX conversations_recent ON conversations(user_id, last_active_at, id);

CREATE TABLE messages (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    agent_id TEXT,
    turn_key TEXT,  -- NULL for imported messages and stored interactions
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    content_hash TEXT NOT NULL,  -- sha256 hex of content (base.text_hash)
    terms TEXT NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (user_id, id),
    UNIQUE (user_id, turn_key, role, content_hash),
    FOREIGN KEY (user_id, conversation_id) REFERENCES conversations(user_id, id) ON DELETE CASCADE
);
CREATE INDEX messages_conversation ON messages(user_id, conversation_id, created_at);
CREATE INDEX messages_hash ON messages(user_id, content_hash);

CREATE TABLE turns (
    seq INTEGER PRIMARY KEY,
    user_id TEXT NOT NULL,
    turn_key TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    agent_id TEXT,
    history_hash TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',
    block TEXT,  -- the memory block of the turn's first step; NULL until computed
    injected INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    UNIQUE (user_id, turn_key),
    FOREIGN KEY (user_id, conversation_id) REFERENCES conversations(user_id, id) ON DELETE CASCADE
);
CREATE INDEX turns_history ON turns(user_id, history_hash, created_at);
CREATE INDEX turns_conversation ON turns(user_id, conversation_id);
CREATE INDEX turns_pending ON turns(status) WHERE status = 'pending';

CREATE TABLE turn_tool_calls (
    user_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    turn_key TEXT NOT NULL,
    name TEXT NOT NULL,
    arguments TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (user_id, call_id),
    FOREIGN KEY (user_id, turn_key) REFERENCES turns(user_id, turn_key) ON DELETE CASCADE
);
CREATE INDEX turn_tool_calls_turn ON turn_tool_calls(user_id, turn_key);

CREATE TABLE reasoning (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    agent_id TEXT,
    conversation_id TEXT NOT NULL,
    turn_key TEXT,  -- NULL for imported traces
    task TEXT NOT NULL,
    steps TEXT NOT NULL,  -- JSON [{"name", "arguments", "result"}]
    answer TEXT NOT NULL,
    terms TEXT NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (user_id, id),
    UNIQUE (user_id, turn_key),
    FOREIGN KEY (user_id, conversation_id) REFERENCES conversations(user_id, id) ON DELETE CASCADE
);
CREATE INDEX reasoning_recent ON reasoning(user_id, created_at);
CREATE INDEX reasoning_agent ON reasoning(user_id, agent_id, created_at);
CREATE INDEX reasoning_conversation ON reasoning(user_id, conversation_id);

CREATE TABLE entities (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    agent_id TEXT,  -- set only under agent isolation; NULL = shared by the user's agents
    name TEXT NOT NULL,
    canonical_name TEXT NOT NULL,  -- case and whitespace folded
    type TEXT NOT NULL DEFAULT '',
    description TEXT NOT NULL DEFAULT '',
    memory_type TEXT NOT NULL DEFAULT 'fact',
    confidence REAL NOT NULL DEFAULT 0.7,
    tags TEXT NOT NULL DEFAULT '[]',  -- JSON list of strings
    aliases TEXT NOT NULL DEFAULT '[]',  -- JSON list of strings
    provenance TEXT NOT NULL DEFAULT '[]',  -- JSON list of message ids
    name_terms TEXT NOT NULL DEFAULT '',  -- index_text(name + aliases)
    type_terms TEXT NOT NULL DEFAULT '',
    description_terms TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    UNIQUE (user_id, id)
);
CREATE UNIQUE INDEX entities_canonical ON entities(user_id, ifnull(agent_id, ''), canonical_name);

CREATE TABLE relationships (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    agent_id TEXT,
    from_id TEXT NOT NULL,
    type TEXT NOT NULL,
    to_id TEXT NOT NULL,
    valid_from REAL NOT NULL,
    invalid_at REAL,  -- set when a contradicting fact replaced this edge
    provenance TEXT NOT NULL DEFAULT '[]',
    created_at REAL NOT NULL,
    UNIQUE (user_id, id),
    FOREIGN KEY (user_id, from_id) REFERENCES entities(user_id, id) ON DELETE CASCADE,
    FOREIGN KEY (user_id, to_id) REFERENCES entities(user_id, id) ON DELETE CASCADE
);
CREATE INDEX relationships_from ON relationships(user_id, from_id, type, invalid_at);
CREATE INDEX relationships_to ON relationships(user_id, to_id);

CREATE TABLE extraction_queue (
    id INTEGER PRIMARY KEY,
    user_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    last_error TEXT,
    parked INTEGER NOT NULL DEFAULT 0,  -- 1 after too many failures: kept, not retried
    created_at REAL NOT NULL,
    UNIQUE (user_id, message_id),
    FOREIGN KEY (user_id, message_id) REFERENCES messages(user_id, id) ON DELETE CASCADE
);
CREATE INDEX extraction_queue_due ON extraction_queue(parked, next_attempt_at);

CREATE TABLE injections (
    seq INTEGER PRIMARY KEY,
    user_id TEXT NOT NULL,
    turn_key TEXT NOT NULL,
    log TEXT NOT NULL,  -- JSON
    created_at REAL NOT NULL,
    UNIQUE (user_id, turn_key),
    FOREIGN KEY (user_id, turn_key) REFERENCES turns(user_id, turn_key) ON DELETE CASCADE
);

CREATE TABLE embeddings (
    user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    kind TEXT NOT NULL,  -- message | entity | reasoning
    item_id TEXT NOT NULL,
    model TEXT NOT NULL,
    dim INTEGER NOT NULL,
    vector BLOB NOT NULL,  -- float32, little-endian
    created_at REAL NOT NULL,
    PRIMARY KEY (user_id, kind, item_id, model)
);
"""


def _fts_index(table: str, columns: tuple[str, ...], kind: str) -> str:
    """An external-content FTS5 table over `columns` of `table`, kept in step by triggers.

    Deleting the source row also drops its embeddings.
    """
    cols = ", ".join(columns)
    old = ", ".join(f"old.{c}" for c in columns)
    new = ", ".join(f"new.{c}" for c in columns)
    fts = f"{table}_fts"
    return f"""
CREATE VIRTUAL TABLE {fts} USING fts5({cols}, content='{table}', content_rowid='seq', {_TOKENIZE});
CREATE TRIGGER {fts}_insert AFTER INSERT ON {table} BEGIN
    INSERT INTO {fts}(rowid, {cols}) VALUES (new.seq, {new});
END;
CREATE TRIGGER {fts}_delete AFTER DELETE ON {table} BEGIN
    INSERT INTO {fts}({fts}, rowid, {cols}) VALUES ('delete', old.seq, {old});
    {_drop_vectors(kind)}
END;
CREATE TRIGGER {fts}_update AFTER UPDATE OF {cols} ON {table} BEGIN
    INSERT INTO {fts}({fts}, rowid, {cols}) VALUES ('delete', old.seq, {old});
    INSERT INTO {fts}(rowid, {cols}) VALUES (new.seq, {new});
END;
"""


def _drop_vectors(kind: str) -> str:
    return f"DELETE FROM embeddings WHERE user_id = old.user_id AND kind = '{kind}' AND item_id = old.id;"


def _fts(table: str, columns: tuple[str, ...], kind: str, watched: str) -> str:
    """`_fts_index`, and a trigger that drops the embeddings when the `watched` columns change
    (the vector no longer describes the text)."""
    stale = (f"CREATE TRIGGER {table}_vectors_stale AFTER UPDATE OF {watched} ON {table} BEGIN\n"
             f"    {_drop_vectors(kind)}\nEND;\n")
    return _fts_index(table, columns, kind) + stale


_V1 = (
    _V1_TABLES
    + _fts("messages", ("terms",), "message", "content")
    + _fts("entities", ("name_terms", "type_terms", "description_terms"), "entity", "name, description")
    + _fts("reasoning", ("terms",), "reasoning", "task, steps, answer")
)

# v2: a message is indexed with the words of the messages just before it in its
# conversation (`context`, a second column weighted lower), so among the messages that say
# the query's words, the one that answers a question about them ranks higher. Messages
# saved before v2 have no context.
_V2 = """
ALTER TABLE messages ADD COLUMN context TEXT NOT NULL DEFAULT '';
DROP TRIGGER messages_fts_insert;
DROP TRIGGER messages_fts_delete;
DROP TRIGGER messages_fts_update;
DROP TABLE messages_fts;
""" + _fts_index("messages", ("terms", "context"), "message") + """
INSERT INTO messages_fts(messages_fts) VALUES ('rebuild');
"""

# v3: the user's own node is looked up by type on every first-person question.
_V3 = """
CREATE INDEX entities_type ON entities(user_id, type);
"""

# v4: a merge key past KEY_MAX_CHARS is its head and a hash (proxy/extracted.py
# bounded_key): keys stored whole before are re-keyed, or their entities would never
# merge again.
_V4 = f"""
UPDATE entities SET canonical_name = memproxy_bounded_key(canonical_name) WHERE length(canonical_name) > {KEY_MAX_CHARS};
"""

# v5: a count of message deletions and re-indexings, by whichever process made them: the
# in-memory message index (sqlite/message_index.py) catches up with new messages by rowid,
# and is rebuilt when this count moves. One count for all users, so it names none (deleting a
# user leaves no row behind that holds its id); such changes are rare (the memory API's
# corrections and deletes, `memproxy reindex`).
_V5 = """
CREATE TABLE IF NOT EXISTS search_epoch (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL
);
INSERT INTO search_epoch (id, epoch) VALUES (1, 0) ON CONFLICT DO NOTHING;
CREATE TRIGGER IF NOT EXISTS messages_epoch_delete AFTER DELETE ON messages BEGIN
    UPDATE search_epoch SET epoch = epoch + 1 WHERE id = 1;
END;
CREATE TRIGGER IF NOT EXISTS messages_epoch_update
    AFTER UPDATE OF seq, user_id, conversation_id, agent_id, terms, context ON messages BEGIN
    UPDATE search_epoch SET epoch = epoch + 1 WHERE id = 1;
END;
"""

# v6: the rowids of entities added, deleted, or whose indexed text, user or agent changed,
# by whichever process: the in-memory entity index (sqlite/entity_index.py) catches up by
# re-reading them. Rowids only, never whose. The log trims itself to its newest 65,536
# rows (in steps of 1,024); postings that fell further behind are rebuilt.
_V6 = """
CREATE TABLE IF NOT EXISTS entity_changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    entity_seq INTEGER NOT NULL
);
CREATE TRIGGER IF NOT EXISTS entity_changes_trim AFTER INSERT ON entity_changes WHEN new.seq % 1024 = 0 BEGIN
    DELETE FROM entity_changes WHERE seq <= new.seq - 65536;
END;
CREATE TRIGGER IF NOT EXISTS entities_changed_insert AFTER INSERT ON entities BEGIN
    INSERT INTO entity_changes (entity_seq) VALUES (new.seq);
END;
CREATE TRIGGER IF NOT EXISTS entities_changed_update
    AFTER UPDATE OF seq, user_id, agent_id, name_terms, type_terms, description_terms ON entities BEGIN
    INSERT INTO entity_changes (entity_seq) VALUES (old.seq);
    INSERT INTO entity_changes (entity_seq) SELECT new.seq WHERE new.seq != old.seq;
END;
CREATE TRIGGER IF NOT EXISTS entities_changed_delete AFTER DELETE ON entities BEGIN
    INSERT INTO entity_changes (entity_seq) VALUES (old.seq);
END;
"""

# v7: a message changed in any column moves `search_epoch` (v5 watched the indexed ones):
# the in-memory message index keeps the messages its searches returned as they read. A
# trace deleted or changed moves `reasoning_epoch`: the in-memory counts of the reasoning
# search (sqlite.search.ReasoningTermCounts) add the traces appended since, and start over
# when it moves.
# And the indexed text each entity change removed and added, by whichever process: the
# in-memory entity term counts (sqlite.entity_index.EntityTermCounts) stay exact by
# reading it, instead of walking FTS5's doclists on every search. A change that leaves the
# text as it was is not logged. The log trims itself to its newest 4,096 rows (in steps of
# 1,024), and a user's deletion empties it; counts further behind are read afresh. (Its
# reader went; v19 drops it.)
_ENTITY_TEXT = "{0}.name_terms || ' ' || {0}.type_terms || ' ' || {0}.description_terms"
_V7 = f"""
DROP TRIGGER IF EXISTS messages_epoch_update;
CREATE TRIGGER IF NOT EXISTS messages_epoch_changed AFTER UPDATE ON messages BEGIN
    UPDATE search_epoch SET epoch = epoch + 1 WHERE id = 1;
END;
CREATE TABLE IF NOT EXISTS reasoning_epoch (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL
);
INSERT INTO reasoning_epoch (id, epoch) VALUES (1, 0) ON CONFLICT DO NOTHING;
CREATE TRIGGER IF NOT EXISTS reasoning_epoch_delete AFTER DELETE ON reasoning BEGIN
    UPDATE reasoning_epoch SET epoch = epoch + 1 WHERE id = 1;
END;
CREATE TRIGGER IF NOT EXISTS reasoning_epoch_update AFTER UPDATE ON reasoning BEGIN
    UPDATE reasoning_epoch SET epoch = epoch + 1 WHERE id = 1;
END;
CREATE TABLE IF NOT EXISTS entity_text_changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    removed TEXT,
    added TEXT
);
CREATE TRIGGER IF NOT EXISTS entity_text_changes_trim AFTER INSERT ON entity_text_changes
    WHEN new.seq % 1024 = 0 BEGIN
    DELETE FROM entity_text_changes WHERE seq <= new.seq - 4096;
END;
CREATE TRIGGER IF NOT EXISTS entities_text_insert AFTER INSERT ON entities BEGIN
    INSERT INTO entity_text_changes (removed, added) VALUES (NULL, {_ENTITY_TEXT.format("new")});
END;
CREATE TRIGGER IF NOT EXISTS entities_text_update AFTER UPDATE OF name_terms, type_terms, description_terms ON entities
    WHEN {_ENTITY_TEXT.format("old")} IS NOT {_ENTITY_TEXT.format("new")} BEGIN
    INSERT INTO entity_text_changes (removed, added) VALUES ({_ENTITY_TEXT.format("old")}, {_ENTITY_TEXT.format("new")});
END;
CREATE TRIGGER IF NOT EXISTS entities_text_delete AFTER DELETE ON entities BEGIN
    INSERT INTO entity_text_changes (removed, added) VALUES ({_ENTITY_TEXT.format("old")}, NULL);
END;
"""

# v8: deletion is final for turns in flight (generations.py): each user's generation and
# the generations users and conversations were deleted at, keyed by hashes (no user_id
# column: a user's deletion keeps its record), and the generation each turn's cached block
# was computed at (0 for blocks cached before v8, as every user's generation starts at 0).
_V8 = """
CREATE TABLE IF NOT EXISTS generations (
    id TEXT PRIMARY KEY,
    generation INTEGER NOT NULL
) WITHOUT ROWID;
ALTER TABLE turns ADD COLUMN block_generation INTEGER NOT NULL DEFAULT 0;
"""

# v9: the response ids relayed on the Responses wire, so a request naming one in
# `previous_response_id` continues its conversation on any replica; a deleted conversation
# (or user) takes its ids along.
_V9 = """
CREATE TABLE IF NOT EXISTS responses (
    user_id TEXT NOT NULL,
    response_id TEXT NOT NULL,
    turn_key TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    parent_id TEXT,  -- the previous_response_id the request named; NULL for a chain's first
    created_at REAL NOT NULL,
    PRIMARY KEY (user_id, response_id),
    FOREIGN KEY (user_id, conversation_id) REFERENCES conversations(user_id, id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS responses_conversation ON responses(user_id, conversation_id);
"""

# v10: hooks (docs/hooks.md). A turn keeps the prompt a user_prompt_submit hook rewrote, for
# its later steps; the context a stop hook leaves for a conversation's next turn waits in
# hook_context, and goes with its conversation.
_V10 = """
ALTER TABLE turns ADD COLUMN prompt TEXT;
CREATE TABLE IF NOT EXISTS hook_context (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    text TEXT NOT NULL,
    created_at REAL NOT NULL,
    FOREIGN KEY (user_id, conversation_id) REFERENCES conversations(user_id, id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS hook_context_conversation ON hook_context(user_id, conversation_id, seq);
"""

# v11: tools mode keeps each step's memory exchange with the step's tool calls, so the next
# step of the loop puts it back in place of the answer the client echoes (on any replica),
# and the provider's id of a response whose client saw another (its first round's).
_V11 = """
ALTER TABLE turn_tool_calls ADD COLUMN exchange TEXT;
ALTER TABLE responses ADD COLUMN provider_id TEXT;
"""

# v12 (after tools mode's v11): a turn keeps its hooks' additional_context apart from its
# block too: a block computed again after a deletion carries it again, since the hooks do
# not run again for the turn.
_V12 = """
ALTER TABLE turns ADD COLUMN hook_context TEXT;
"""

# v13: a step's tool calls are kept per turn, keyed (user, call id, turn): a provider that
# numbers its calls per response (`call_0`) reuses ids across the user's turns and
# conversations, and one turn's row must not replace another's (its exchange, its routing).
# SQLite cannot change a primary key in place: the table is made again under its name. The
# key's prefix serves the lookup by call id, as before; the index the one by turn. Written to
# run again over its own work.
_V13 = """
CREATE TABLE IF NOT EXISTS turn_tool_calls_v13 (
    user_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    turn_key TEXT NOT NULL,
    name TEXT NOT NULL,
    arguments TEXT NOT NULL,
    created_at REAL NOT NULL,
    exchange TEXT,
    PRIMARY KEY (user_id, call_id, turn_key),
    FOREIGN KEY (user_id, turn_key) REFERENCES turns(user_id, turn_key) ON DELETE CASCADE
);
INSERT OR IGNORE INTO turn_tool_calls_v13 (user_id, call_id, turn_key, name, arguments, created_at, exchange)
    SELECT user_id, call_id, turn_key, name, arguments, created_at, exchange FROM turn_tool_calls;
DROP TABLE turn_tool_calls;
ALTER TABLE turn_tool_calls_v13 RENAME TO turn_tool_calls;
CREATE INDEX IF NOT EXISTS turn_tool_calls_turn ON turn_tool_calls(user_id, turn_key);
"""

# v14: an entity's newest edges each way, in the order a recall reads them: a hub node (the
# user's own, expanded for any first-person question) is read in proportion to the edges
# wanted, not sorted whole on every recall.
_V14 = """
CREATE INDEX IF NOT EXISTS relationships_from_newest ON relationships(user_id, from_id, valid_from);
CREATE INDEX IF NOT EXISTS relationships_to_newest ON relationships(user_id, to_id, valid_from);
"""

# v15: who created each provider object memproxy saw created with its own provider key (a
# response, a conversation, a file): the key is shared, so the provider alone would answer
# any user naming the id. Not the user's memory, but deleted with the user as every row naming them.
_V15 = """
CREATE TABLE IF NOT EXISTS provider_objects (
    provider TEXT NOT NULL,
    object_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (provider, object_id)
);
CREATE INDEX IF NOT EXISTS provider_objects_user ON provider_objects(user_id);
"""

# v16: extraction items leased to the process that claimed them (sqlite/queue.py): the
# worker processes of one file share its queue, and one user's items go to one at a time.
# The processes with the file open (sqlite/processes.py): one starting leaves alone the turns
# another is serving.
_V16 = """
CREATE TABLE IF NOT EXISTS processes (id TEXT PRIMARY KEY, opened_at REAL NOT NULL);
ALTER TABLE extraction_queue ADD COLUMN claimed_until REAL;
ALTER TABLE extraction_queue ADD COLUMN claimed_by TEXT;
CREATE INDEX IF NOT EXISTS extraction_queue_leased ON extraction_queue(user_id, claimed_until)
    WHERE claimed_until IS NOT NULL;
"""

# v17 (PostgreSQL v12): where an explicitly stored memory came from (memory_api, tools, mcp); NULL
# for extracted ones.
_V17 = """
ALTER TABLE entities ADD COLUMN stored_via TEXT;
"""

# v18: a user's newest vector of a kind and model in one index probe (rowid is the index's
# last column): each recall checks that the cached vectors are current, since another
# process sharing the store may have saved some since, and reads only those after.
_V18 = """
CREATE INDEX IF NOT EXISTS embeddings_newest ON embeddings(user_id, kind, model);
"""

# v19: v7's log of the index words each entity change removed and added goes: nothing has
# read it since the searches count terms from the user's own postings, and it held the words
# of every user's entities, a deleted memory's among them, until 4,096 later changes pushed
# them out (secure_delete zeroes the dropped pages).
_V19 = """
DROP TRIGGER IF EXISTS entities_text_insert;
DROP TRIGGER IF EXISTS entities_text_update;
DROP TRIGGER IF EXISTS entities_text_delete;
DROP TRIGGER IF EXISTS entity_text_changes_trim;
DROP TABLE IF EXISTS entity_text_changes;
"""

# v20: a vector row's seq never comes again. Without AUTOINCREMENT a new row takes the
# rowid after the largest left, so once the newest vectors were deleted (their
# conversation, on any process) the next one was numbered at or below the mark a process's
# cached matrix was read to, and that process never read it (memory/vectors/index.py).
# SQLite cannot add AUTOINCREMENT in place: the table is made again under its name, each
# row keeping its seq; the triggers of the item tables name it, and find it again under
# its old name only with the legacy rename (the current one checks them against the
# schema while it has no such table). Written to run again over its own work. It copies
# every vector once, in the start-up's migration (before any worker starts): on a shared
# 2-core host 5 s for 100,000 vectors of 128 floats, 7 s for 20,000 of 1,536, and the file
# grows by the table's size (the old pages are free, and later writes reuse them). A vector
# whose user row is gone (deleted where foreign keys were off, as in the sqlite3 shell) is
# not copied: the new table checks the user, and one such row would fail the whole step.
_V20 = """
CREATE TABLE IF NOT EXISTS embeddings_v20 (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    kind TEXT NOT NULL,
    item_id TEXT NOT NULL,
    model TEXT NOT NULL,
    dim INTEGER NOT NULL,
    vector BLOB NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (user_id, kind, item_id, model)
);
INSERT OR IGNORE INTO embeddings_v20 (seq, user_id, kind, item_id, model, dim, vector, created_at)
    SELECT rowid, user_id, kind, item_id, model, dim, vector, created_at FROM embeddings
    WHERE user_id IN (SELECT id FROM users) ORDER BY rowid;
DROP TABLE embeddings;
PRAGMA legacy_alter_table = ON;
ALTER TABLE embeddings_v20 RENAME TO embeddings;
PRAGMA legacy_alter_table = OFF;
CREATE INDEX IF NOT EXISTS embeddings_newest ON embeddings(user_id, kind, model);
"""

# Append only: a released script never changes; a schema change is a new script.
MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _V10, _V11, _V12, _V13, _V14, _V15,
                               _V16, _V17, _V18, _V19, _V20)

FTS_TABLES = ("messages_fts", "entities_fts", "reasoning_fts")


def statements(script: str) -> list[str]:
    """Split a script into complete statements (trigger bodies stay whole)."""
    out: list[str] = []
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    if buf.strip():
        raise ValueError(f"incomplete SQL statement: {buf.strip()[:80]}")
    return out


_ADD_COLUMN = re.compile(r"ALTER TABLE (\w+) ADD COLUMN (\w+)", re.IGNORECASE)


def _adds_existing_column(conn: sqlite3.Connection, statement: str) -> bool:
    """True for an ADD COLUMN of a column the table has: SQLite has no ADD COLUMN IF NOT EXISTS,
    and a script applied again (a schema_version row lost) must not fail on it."""
    added = _ADD_COLUMN.match(statement)
    return added is not None and any(
        column[1] == added[2] for column in conn.execute(f'PRAGMA table_info("{added[1]}")'))


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the schema up to date in one IMMEDIATE transaction; return its version."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
    conn.create_function("memproxy_bounded_key", 1, bounded_key, deterministic=True)
    # IMMEDIATE, then read the version: two processes opening at once migrate once.
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = int(conn.execute("SELECT ifnull(max(version), 0) FROM schema_version").fetchone()[0])
        if current > len(MIGRATIONS):
            raise sqlite3.DatabaseError(f"schema version {current} is newer than this memproxy knows")
        for version, script in enumerate(MIGRATIONS[current:], start=current + 1):
            for statement in statements(script):
                if not _adds_existing_column(conn, statement):
                    conn.execute(statement)
            conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (version, time.time()))
        conn.execute("COMMIT")
    except BaseException:
        conn.rollback()
        raise
    return len(MIGRATIONS)
