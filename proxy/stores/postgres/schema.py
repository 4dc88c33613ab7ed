"""The PostgreSQL schema: the SQLite schema's tables and keys, as numbered migrations.

It mirrors sqlite/schema.py table for table, column for column, with these differences:
- Timestamps are `timestamptz` (asyncpg returns aware UTC datetimes).
- Ids, keys and terms are `COLLATE "C"`: byte order like SQLite's, whatever the database's
  locale, so pages and tie-breaks come out in the same order on both backends.
- Full-text search is an inverted index of our own instead of FTS5. PostgreSQL's text
  parser splits on `_` (so `to_tsvector` would cut `internal_hbr_2291_example` apart);
  the `*terms` columns already hold the index terms (proxy.terms), so each item's terms
  go into a `<kind>_postings` table, one row per (user, term, item) with the term
  frequency and the item's length; `term_stats` keeps each user's document frequency of
  each term, `lexicon_stats` each user's item count and total length (as deltas folded
  at each commit: fold_stats). A search reads those counts and the query terms' postings
  through their keys and computes FTS5's BM25 exactly, per user, in one statement: no
  scan of the user's items.
- Postings, statistics and stale embeddings are kept in step by statement-level triggers
  with transition tables, so every insert, update and delete path - FK cascades included -
  updates them, as the FTS5 triggers do on SQLite.
- Vectors are `real[]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from proxy.extracted import KEY_MAX_CHARS
from proxy.stores.indexed_text import CONTEXT_CHARS_PER_MESSAGE, CONTEXT_MESSAGES

# pg_advisory_xact_lock key that serialises migrations across replicas opening at once.
MIGRATION_LOCK = 0x6D656D70726F7879  # "memproxy"

_C = 'COLLATE "C"'

_V1_TABLES = f"""
CREATE TABLE users (
    id text {_C} PRIMARY KEY,
    created_at timestamptz NOT NULL
);

CREATE TABLE conversations (
    user_id text {_C} NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    id text {_C} NOT NULL,
    agent_id text {_C},
    created_at timestamptz NOT NULL,
    last_active_at timestamptz NOT NULL,
    PRIMARY KEY (user_id, id)
);
CREATE INDEX conversations_recent ON conversations(user_id, last_active_at, id);

CREATE TABLE messages (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id text {_C} NOT NULL,
    user_id text {_C} NOT NULL,
    conversation_id text {_C} NOT NULL,
    agent_id text {_C},
    turn_key text {_C},
    role text NOT NULL,
    content text NOT NULL,
    content_hash text {_C} NOT NULL,
    terms text NOT NULL,
    context text NOT NULL DEFAULT '',  -- the terms of the messages just before (message_context)
    created_at timestamptz NOT NULL,
    UNIQUE (user_id, id),
    UNIQUE (user_id, turn_key, role, content_hash),
    FOREIGN KEY (user_id, conversation_id) REFERENCES conversations(user_id, id) ON DELETE CASCADE
);
CREATE INDEX messages_conversation ON messages(user_id, conversation_id, created_at);
CREATE INDEX messages_hash ON messages(user_id, content_hash);

CREATE TABLE turns (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id text {_C} NOT NULL,
    turn_key text {_C} NOT NULL,
    conversation_id text {_C} NOT NULL,
    agent_id text {_C},
    history_hash text {_C} NOT NULL,
    status text NOT NULL DEFAULT 'pending',
    block text,
    injected integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    UNIQUE (user_id, turn_key),
    FOREIGN KEY (user_id, conversation_id) REFERENCES conversations(user_id, id) ON DELETE CASCADE
);
CREATE INDEX turns_history ON turns(user_id, history_hash, created_at);
CREATE INDEX turns_conversation ON turns(user_id, conversation_id);
CREATE INDEX turns_pending ON turns(updated_at) WHERE status = 'pending';

CREATE TABLE turn_tool_calls (
    user_id text {_C} NOT NULL,
    call_id text {_C} NOT NULL,
    turn_key text {_C} NOT NULL,
    name text NOT NULL,
    arguments text NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (user_id, call_id),
    FOREIGN KEY (user_id, turn_key) REFERENCES turns(user_id, turn_key) ON DELETE CASCADE
);
CREATE INDEX turn_tool_calls_turn ON turn_tool_calls(user_id, turn_key);

CREATE TABLE reasoning (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id text {_C} NOT NULL,
    user_id text {_C} NOT NULL,
    agent_id text {_C},
    conversation_id text {_C} NOT NULL,
    turn_key text {_C},
    task text NOT NULL,
    steps text NOT NULL,
    answer text NOT NULL,
    terms text NOT NULL,
    created_at timestamptz NOT NULL,
    UNIQUE (user_id, id),
    UNIQUE (user_id, turn_key),
    FOREIGN KEY (user_id, conversation_id) REFERENCES conversations(user_id, id) ON DELETE CASCADE
);
CREATE INDEX reasoning_recent ON reasoning(user_id, created_at);
CREATE INDEX reasoning_agent ON reasoning(user_id, agent_id, created_at);
CREATE INDEX reasoning_conversation ON reasoning(user_id, conversation_id);

CREATE TABLE entities (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id text {_C} NOT NULL,
    user_id text {_C} NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    agent_id text {_C},
    name text NOT NULL,
    canonical_name text {_C} NOT NULL,
    type text NOT NULL DEFAULT '',
    description text NOT NULL DEFAULT '',
    memory_type text NOT NULL DEFAULT 'fact',
    confidence double precision NOT NULL DEFAULT 0.7,
    tags text NOT NULL DEFAULT '[]',
    aliases text NOT NULL DEFAULT '[]',
    provenance text NOT NULL DEFAULT '[]',
    name_terms text NOT NULL DEFAULT '',
    type_terms text NOT NULL DEFAULT '',
    description_terms text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    UNIQUE (user_id, id)
);
CREATE UNIQUE INDEX entities_canonical ON entities(user_id, coalesce(agent_id, ''), canonical_name);
CREATE INDEX entities_type ON entities(user_id, type);  -- the user's own node, on first-person questions

CREATE TABLE relationships (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id text {_C} NOT NULL,
    user_id text {_C} NOT NULL,
    agent_id text {_C},
    from_id text {_C} NOT NULL,
    type text NOT NULL,
    to_id text {_C} NOT NULL,
    valid_from timestamptz NOT NULL,
    invalid_at timestamptz,
    provenance text NOT NULL DEFAULT '[]',
    created_at timestamptz NOT NULL,
    UNIQUE (user_id, id),
    FOREIGN KEY (user_id, from_id) REFERENCES entities(user_id, id) ON DELETE CASCADE,
    FOREIGN KEY (user_id, to_id) REFERENCES entities(user_id, id) ON DELETE CASCADE
);
CREATE INDEX relationships_from ON relationships(user_id, from_id, type, invalid_at);
CREATE INDEX relationships_to ON relationships(user_id, to_id);

CREATE TABLE extraction_queue (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id text {_C} NOT NULL,
    message_id text {_C} NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    last_error text,
    parked boolean NOT NULL DEFAULT false,
    claimed_until timestamptz,  -- leased to the replica that claimed it until then
    created_at timestamptz NOT NULL,
    UNIQUE (user_id, message_id),
    FOREIGN KEY (user_id, message_id) REFERENCES messages(user_id, id) ON DELETE CASCADE
);
CREATE INDEX extraction_queue_due ON extraction_queue(parked, next_attempt_at);

CREATE TABLE injections (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id text {_C} NOT NULL,
    turn_key text {_C} NOT NULL,
    log text NOT NULL,
    created_at timestamptz NOT NULL,
    UNIQUE (user_id, turn_key),
    FOREIGN KEY (user_id, turn_key) REFERENCES turns(user_id, turn_key) ON DELETE CASCADE
);

CREATE TABLE embeddings (
    user_id text {_C} NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    kind text {_C} NOT NULL,
    item_id text {_C} NOT NULL,
    model text {_C} NOT NULL,
    dim integer NOT NULL,
    vector real[] NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (user_id, kind, item_id, model)
);

-- Per user and kind of item, how many items hold each term (in any column: BM25's document
-- frequency) and how many hold it in a column that finds them (a message's own words), and
-- (lexicon_stats) how many items there are and their total length. Kept as deltas: each
-- index change appends rows, never updates one, and a transaction folds its users' new
-- (`fresh`) rows into one per key before it commits (fold_stats). Updating one row many
-- times in a transaction costs more each time (an import of 8k messages took 50 s);
-- readers sum whatever rows a key has.
CREATE TABLE term_stats (
    user_id text {_C} NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    kind text {_C} NOT NULL,
    term text {_C} NOT NULL,
    docs integer NOT NULL,
    finding integer NOT NULL,
    fresh boolean NOT NULL DEFAULT true
);
CREATE INDEX term_stats_key ON term_stats(user_id, kind, term) INCLUDE (docs, finding);
CREATE INDEX term_stats_fresh ON term_stats(user_id) WHERE fresh;

CREATE TABLE lexicon_stats (
    user_id text {_C} NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    kind text {_C} NOT NULL,
    docs bigint NOT NULL,
    tokens bigint NOT NULL,
    fresh boolean NOT NULL DEFAULT true
);
CREATE INDEX lexicon_stats_key ON lexicon_stats(user_id, kind) INCLUDE (docs, tokens);
CREATE INDEX lexicon_stats_fresh ON lexicon_stats(user_id) WHERE fresh;

CREATE FUNCTION fold_stats(p_users text[]) RETURNS void LANGUAGE sql AS $$
    WITH keys AS (SELECT DISTINCT user_id, kind, term FROM term_stats WHERE fresh AND user_id = ANY(p_users)),
    gone AS (DELETE FROM term_stats t USING keys k WHERE t.user_id = k.user_id AND t.kind = k.kind
             AND t.term = k.term RETURNING t.user_id, t.kind, t.term, t.docs, t.finding)
    INSERT INTO term_stats (user_id, kind, term, docs, finding, fresh)
        SELECT user_id, kind, term, sum(docs), sum(finding), false FROM gone GROUP BY user_id, kind, term
        HAVING sum(docs) <> 0 OR sum(finding) <> 0;
    WITH keys AS (SELECT DISTINCT user_id, kind FROM lexicon_stats WHERE fresh AND user_id = ANY(p_users)),
    gone AS (DELETE FROM lexicon_stats l USING keys k WHERE l.user_id = k.user_id AND l.kind = k.kind
             RETURNING l.user_id, l.kind, l.docs, l.tokens)
    INSERT INTO lexicon_stats (user_id, kind, docs, tokens, fresh)
        SELECT user_id, kind, sum(docs), sum(tokens), false FROM gone GROUP BY user_id, kind;
$$;

-- A new message's context: the start (p_chars, cut at a space) of the terms of the p_messages
-- messages said at or before p_at in its conversation, oldest first (sqlite_rows.context_terms).
CREATE FUNCTION message_context(p_user text, p_conversation text, p_at timestamptz, p_messages integer,
                                p_chars integer) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce(string_agg(CASE
        WHEN length(b.terms) <= p_chars THEN b.terms
        WHEN strpos(reverse(substr(b.terms, 1, p_chars)), ' ') BETWEEN 1 AND p_chars - 1
            THEN substr(b.terms, 1, p_chars - strpos(reverse(substr(b.terms, 1, p_chars)), ' '))
        ELSE substr(b.terms, 1, p_chars) END, ' ' ORDER BY b.created_at, b.seq), '')
    FROM (SELECT terms, created_at, seq FROM messages WHERE user_id = p_user AND conversation_id = p_conversation
          AND created_at <= p_at ORDER BY created_at DESC, seq DESC LIMIT p_messages) b
$$;

"""


def _split(column: str) -> str:
    return f"string_to_array(r.{column}, ' ')"


@dataclass(frozen=True)
class _Index:
    """The postings of one item table and the triggers that keep them, the stats and vectors in step.

    `weighted` is (terms column, weight, finds): a term's frequency is the weighted count
    over the columns and an item's length the plain count, as FTS5's bm25() with column
    weights; a posting `finds` its item when the term is in a column that finds (a message
    is found by its own words; the words before it only add to its score).
    Changing a `watched` column drops the item's embeddings (they no longer describe it).
    """

    table: str
    kind: str
    weighted: tuple[tuple[str, float, bool], ...]
    watched: tuple[str, ...]

    @property
    def postings(self) -> str:
        return f"{self.kind}_postings"

    @property
    def _terms(self) -> str:
        return " UNION ALL ".join(f"SELECT unnest({_split(c)}), {w}::float8, {str(f).lower()}"
                                  for c, w, f in self.weighted)

    @property
    def _length(self) -> str:
        return " + ".join(f"coalesce(cardinality({_split(c)}), 0)" for c, _, _ in self.weighted)

    def add(self, rows: str) -> str:
        """Index `rows` (a relation aliased r): their postings, and the stats counting them."""
        columns = ", ".join(f"r.{c}" for c, _, _ in self.weighted)
        return f"""
    -- MATERIALIZED: inlined, the length would be computed again for every term of the item.
    WITH r AS MATERIALIZED (SELECT r.user_id, r.seq, {columns}, {self._length} AS dl FROM {rows} r),
    p AS (INSERT INTO {self.postings} (user_id, term, doc, tf, dl, finds)
        SELECT r.user_id, t.term, r.seq, sum(t.w), r.dl, bool_or(t.finds) FROM r
        CROSS JOIN LATERAL ({self._terms}) AS t(term, w, finds) WHERE t.term <> ''
        GROUP BY r.user_id, t.term, r.seq, r.dl RETURNING user_id, term, finds)
    INSERT INTO term_stats (user_id, kind, term, docs, finding)
        SELECT p.user_id, '{self.kind}', p.term, count(*), count(*) FILTER (WHERE p.finds) FROM p
        GROUP BY p.user_id, p.term;
    INSERT INTO lexicon_stats (user_id, kind, docs, tokens)
        SELECT r.user_id, '{self.kind}', count(*), sum({self._length}) FROM {rows} r GROUP BY r.user_id;"""

    def remove(self, rows: str) -> str:
        """Take `rows` out of the index and the stats (their postings are found by primary key)."""
        return f"""
    WITH gone AS (DELETE FROM {self.postings} p USING (SELECT DISTINCT r.user_id, r.seq, t.term FROM {rows} r
        CROSS JOIN LATERAL ({self._terms}) AS t(term, w, finds)) d
        WHERE p.user_id = d.user_id AND p.term = d.term AND p.doc = d.seq RETURNING p.user_id, p.term, p.finds)
    -- Not for a user being deleted: the stats go with the users row.
    INSERT INTO term_stats (user_id, kind, term, docs, finding)
        SELECT g.user_id, '{self.kind}', g.term, -count(*), -count(*) FILTER (WHERE g.finds) FROM gone g
        WHERE EXISTS (SELECT 1 FROM users u WHERE u.id = g.user_id) GROUP BY g.user_id, g.term;
    INSERT INTO lexicon_stats (user_id, kind, docs, tokens)
        SELECT r.user_id, '{self.kind}', -count(*), -sum({self._length}) FROM {rows} r
        WHERE EXISTS (SELECT 1 FROM users u WHERE u.id = r.user_id) GROUP BY r.user_id;"""

    def drop_vectors(self, rows: str) -> str:
        return f"""
    DELETE FROM embeddings e USING {rows} r WHERE e.user_id = r.user_id AND e.kind = '{self.kind}'
        AND e.item_id = r.id;"""

    def _changed(self, columns: Sequence[str], side: str) -> str:
        """The `side` (o: old, n: new) rows of an UPDATE whose `columns` changed."""
        old, new = ", ".join(f"o.{c}" for c in columns), ", ".join(f"n.{c}" for c in columns)
        return (f"(SELECT {side}.* FROM old_rows o JOIN new_rows n ON n.seq = o.seq"
                f" WHERE ({old}) IS DISTINCT FROM ({new}))")

    def script(self) -> str:
        """The postings table, then one statement-level trigger per event."""
        indexed = [c for c, _, _ in self.weighted]
        bodies = {
            "insert": ("NEW TABLE AS new_rows", self.add("new_rows")),
            "delete": ("OLD TABLE AS old_rows", self.remove("old_rows") + self.drop_vectors("old_rows")),
            "update": ("OLD TABLE AS old_rows NEW TABLE AS new_rows",
                       self.remove(self._changed(indexed, "o")) + self.add(self._changed(indexed, "n"))
                       + self.drop_vectors(self._changed(self.watched, "o"))),
        }
        script = f"""
CREATE TABLE {self.postings} (
    user_id text {_C} NOT NULL,
    term text {_C} NOT NULL,
    doc bigint NOT NULL,
    tf double precision NOT NULL,
    dl integer NOT NULL,
    finds boolean NOT NULL,
    PRIMARY KEY (user_id, term, doc) INCLUDE (tf, dl, finds)
);
"""
        return script + "".join(_trigger(self.table, event, referencing, body)
                                for event, (referencing, body) in bodies.items())


def _trigger(table: str, event: str, referencing: str, body: str) -> str:
    """A statement-level trigger running `body` (a statement that touched no row does nothing)."""
    name = f"{table}_index_{event}"
    first = referencing.split()[-1]
    return f"""
CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {first}) THEN
        RETURN NULL;
    END IF;{body}
    RETURN NULL;
END
$body$;
CREATE TRIGGER {name} AFTER {event.upper()} ON {table} REFERENCING {referencing}
    FOR EACH STATEMENT EXECUTE FUNCTION {name}();
"""


INDEXES = (
    # A message's own words, then the words said just before it (sqlite/search.py's MESSAGES weights).
    _Index("messages", "message", (("terms", 1.0, True), ("context", 0.3, False)), ("content",)),
    # A name match says more about an entity than its type or description does (sqlite/search.py's ENTITIES weights).
    _Index("entities", "entity", (("name_terms", 2.0, True), ("type_terms", 1.0, True),
                                  ("description_terms", 1.0, True)), ("name", "description")),
    _Index("reasoning", "reasoning", (("terms", 1.0, True),), ("task", "steps", "answer")),
)
_V1 = _V1_TABLES + "".join(index.script() for index in INDEXES)

# v2: a claimed extraction item names its claimant (one id per store, so per replica), so a
# claim can skip the users whose items another replica holds (postgres/queue.py); the
# partial index finds a user's leased items without reading the rest of their queue.
_V2 = f"""
ALTER TABLE extraction_queue ADD COLUMN claimed_by text {_C};
CREATE INDEX extraction_queue_leased ON extraction_queue(user_id, claimed_until) WHERE claimed_until IS NOT NULL;
"""

# v3: a message with no words (emoji only) adds nothing to the context of those after it,
# where it left an empty token that the index's length counted (indexed_text.context_terms).
_V3 = """
CREATE OR REPLACE FUNCTION message_context(p_user text, p_conversation text, p_at timestamptz, p_messages integer,
                                           p_chars integer) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce(string_agg(CASE
        WHEN length(b.terms) <= p_chars THEN b.terms
        WHEN strpos(reverse(substr(b.terms, 1, p_chars)), ' ') BETWEEN 1 AND p_chars - 1
            THEN substr(b.terms, 1, p_chars - strpos(reverse(substr(b.terms, 1, p_chars)), ' '))
        ELSE substr(b.terms, 1, p_chars) END, ' ' ORDER BY b.created_at, b.seq) FILTER (WHERE b.terms <> ''), '')
    FROM (SELECT terms, created_at, seq FROM messages WHERE user_id = p_user AND conversation_id = p_conversation
          AND created_at <= p_at ORDER BY created_at DESC, seq DESC LIMIT p_messages) b
$$;
"""

# v4: a merge key past KEY_MAX_CHARS is its head and a hash (proxy/extracted.py
# bounded_key, computed the same way here): keys stored whole before are re-keyed, or their
# entities would never merge again.
_V4 = f"""
UPDATE entities SET canonical_name = left(canonical_name, {KEY_MAX_CHARS}) || '#'
    || left(encode(sha256(convert_to(canonical_name, 'UTF8')), 'hex'), 32)
    WHERE length(canonical_name) > {KEY_MAX_CHARS};
"""

# v5: deletion is final for turns in flight (generations.py), as SQLite's v8: each user's
# generation and the generations users and conversations were deleted at, keyed by hashes,
# and the generation each turn's cached block was computed at.
_V5 = f"""
CREATE TABLE IF NOT EXISTS generations (
    id text {_C} PRIMARY KEY,
    generation bigint NOT NULL
);
ALTER TABLE turns ADD COLUMN IF NOT EXISTS block_generation bigint NOT NULL DEFAULT 0;
"""

# v6: the response ids relayed on the Responses wire, so a request naming one in
# `previous_response_id` continues its conversation on any replica; a deleted conversation
# (or user) takes its ids along.
_V6 = f"""
CREATE TABLE IF NOT EXISTS responses (
    user_id text {_C} NOT NULL,
    response_id text {_C} NOT NULL,
    turn_key text {_C} NOT NULL,
    conversation_id text {_C} NOT NULL,
    parent_id text {_C},
    created_at timestamptz NOT NULL,
    PRIMARY KEY (user_id, response_id),
    FOREIGN KEY (user_id, conversation_id) REFERENCES conversations(user_id, id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS responses_conversation ON responses(user_id, conversation_id);
"""

# v7: hooks (docs/hooks.md), as SQLite's v10. A turn keeps the prompt a user_prompt_submit
# hook rewrote, for its later steps; the context a stop hook leaves for a conversation's next
# turn waits in hook_context, and goes with its conversation.
_V7 = f"""
ALTER TABLE turns ADD COLUMN IF NOT EXISTS prompt text;
CREATE TABLE IF NOT EXISTS hook_context (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id text {_C} NOT NULL,
    conversation_id text {_C} NOT NULL,
    text text NOT NULL,
    created_at timestamptz NOT NULL,
    FOREIGN KEY (user_id, conversation_id) REFERENCES conversations(user_id, id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS hook_context_conversation ON hook_context(user_id, conversation_id, seq);
"""

# v8: tools mode keeps each step's memory exchange with the step's tool calls, and the
# provider's id of a response whose client saw another, as SQLite's v11.
_V8 = """
ALTER TABLE turn_tool_calls ADD COLUMN IF NOT EXISTS exchange text;
ALTER TABLE responses ADD COLUMN IF NOT EXISTS provider_id text;
"""

# v9 (after tools mode's v8): as SQLite's v12. A turn keeps its hooks' additional_context
# apart from its block too: a block computed again after a deletion carries it again.
_V9 = """
ALTER TABLE turns ADD COLUMN IF NOT EXISTS hook_context text;
"""

# v10: as SQLite's v13. A step's tool calls are kept per turn, keyed (user, call id, turn): a
# provider that numbers its calls per response (`call_0`) reuses ids across the user's turns
# and conversations, and one turn's row must not replace another's. The key's prefix still
# serves the lookup by call id.
_V10 = """
ALTER TABLE turn_tool_calls DROP CONSTRAINT IF EXISTS turn_tool_calls_pkey;
ALTER TABLE turn_tool_calls ADD CONSTRAINT turn_tool_calls_pkey PRIMARY KEY (user_id, call_id, turn_key);
"""

# v11: as SQLite's v15. Who created each provider object memproxy saw created with its own
# provider key, shared by every replica.
_V11 = f"""
CREATE TABLE IF NOT EXISTS provider_objects (
    provider text {_C} NOT NULL,
    object_id text {_C} NOT NULL,
    user_id text {_C} NOT NULL,
    kind text NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (provider, object_id)
);
CREATE INDEX IF NOT EXISTS provider_objects_user ON provider_objects(user_id);
"""

# v12: as SQLite's v17. Where an explicitly stored memory came from (memory_api, tools, mcp); NULL
# for extracted ones.
_V12 = """
ALTER TABLE entities ADD COLUMN IF NOT EXISTS stored_via text;
"""

# Append only: a released script never changes; a schema change is a new script.
MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _V10, _V11, _V12)

POSTINGS_TABLES = ("message_postings", "entity_postings", "reasoning_postings")
# A new message's context column, given SQL for its user, conversation and time.
CONTEXT_SQL = f"message_context({{}}, {{}}, {{}}, {CONTEXT_MESSAGES}, {CONTEXT_CHARS_PER_MESSAGE})"
# The search index's own tables: derived from the items, kept by the triggers.
INTERNAL_TABLES = (*POSTINGS_TABLES, "lexicon_stats", "term_stats")


async def migrate(conn: asyncpg.Connection) -> int:
    """Bring the schema (of the connection's search_path) up to date; return its version."""
    async with conn.transaction():
        # Locked before reading the version: replicas opening at once migrate once.
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await conn.execute("CREATE TABLE IF NOT EXISTS schema_version"
                           " (version integer PRIMARY KEY, applied_at timestamptz NOT NULL)")
        current = await conn.fetchval("SELECT coalesce(max(version), 0) FROM schema_version")
        if current > len(MIGRATIONS):
            raise ValueError(f"schema version {current} is newer than this memproxy knows")
        for version, script in enumerate(MIGRATIONS[current:], start=current + 1):
            await conn.execute(script)
            await conn.execute("INSERT INTO schema_version (version, applied_at) VALUES ($1, now())", version)
    return len(MIGRATIONS)
