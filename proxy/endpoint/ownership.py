"""Provider objects kept per user where memproxy's own provider key serves several users.

The rules are provider_objects.py's; this module reads and records who created what in the
store (so every process and replica agrees), refuses what a request may not reach, and
records the ids a creation's answer carries before the client has them whole: an event of a
stream that shows one (Responses' `response.created` first, then each output item) waits for
its record, a JSON answer's last chunk does, each for at most memory.commit_timeout_ms (a busy store does not hold the answer; the record
lands after: a request of this process naming the id waits for it, another process refuses it
until then).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from proxy.endpoint import provider_objects
from proxy.errors import OwnershipUnavailable, ProviderObjectNotFound, ProviderObjectsUnattributed, UnreadableReferences
from proxy.endpoint.provider_objects import Unreadable
from proxy.http.responses import is_readable_sse, readable_body, stream_inflater
from proxy.identity.scope import RequestScope
from proxy.settings import Settings
from proxy.stores.base import ProviderObjects, StoreError
from proxy.http.upstream import Upstream
from proxy.wires.base import LARGE_BODY_BYTES, Provider
from proxy.wires.sse import SSEDecoder

log = logging.getLogger("memproxy.ownership")

# A creation's JSON answer longer than this is relayed without its id recorded (the object
# is then refused to everyone, and a warning logged). A description is a few KiB, but a
# response's output can hold generated images in base64, megabytes each. The bound keeps
# what one answer holds in memory, and the parse (which holds the interpreter even in a
# thread: 10-40 ms a 16 MiB answer), small.
CREATED_BODY_MAX = 16 * 1024 * 1024
# A record the store refused for a transient reason (locked, unreachable) is tried again this
# many times in all, this long apart: unrecorded, the object is lost to its creator too.
RECORD_ATTEMPTS = 3
RECORD_RETRY_S = 1.0


class Ownership:
    """Who may reach which provider object, for the requests memproxy's key serves."""

    def __init__(self, settings: Settings, upstream: Upstream, store: ProviderObjects) -> None:
        self._per_user = settings.auth.provider_objects == "per-user"
        self._upstream = upstream
        self._store = store
        self._wait_s = settings.memory.commit_timeout_ms / 1000
        # Records still going after their answer went on, by (provider, id): a request of this
        # process naming one waits for it rather than find it unrecorded.
        self._writing: dict[tuple[str, str], asyncio.Task[None]] = {}

    def owner(self, resolved: RequestScope, provider: Provider) -> str | None:
        """The user whose objects this request may reach, None when they are not kept per user: a
        user proved by key or token, and memproxy's own key going to the provider."""
        if not self._per_user or resolved.authenticated_user is None or not self._upstream.api_key(provider):
            return None
        return resolved.authenticated_user

    async def admit(self, user: str, provider: Provider, method: str, path: str, version: str = "/v1"
                    ) -> str | None:
        """Refuse what `user` may not reach at this path (after `version`); the kind of object the
        request creates, if any."""
        access = provider_objects.access(method, path, version)
        if access.verdict == "unattributed":
            raise ProviderObjectsUnattributed(
                f"{method} {version}{path} reaches provider objects memproxy cannot attribute to a user; "
                "auth.provider_objects: shared opens it where one tenant uses memproxy")
        if access.verdict == "names":
            await self._check(user, provider, access.kind, access.object_id)
            return access.adds or None
        return access.kind if access.verdict == "creates" else None

    async def check_body(self, user: str, provider: Provider, path: str, body: bytes) -> Any:
        """Refuse a body to `path` (after /v1) naming an object that is not `user`'s (a previous
        response, a file, ...); the body's JSON as read for that, None when it was not read."""
        try:
            found = (await asyncio.to_thread(provider_objects.references, body, path) if len(body) > LARGE_BODY_BYTES
                     else provider_objects.references(body, path))
        except Unreadable:
            raise UnreadableReferences("the request body may name provider objects but is not JSON memproxy "
                                       "can read") from None
        for kind, object_id in dict.fromkeys(found.named):
            await self._check(user, provider, kind, object_id,
                              "previous_response_id" if kind == "response" else None)
        return found.document

    @staticmethod
    def created_by_body(path: str, document: Any) -> str | None:
        """The kind of object a call otherwise stateless creates because of what its body asks (a
        chat completion's audio), from the body as `check_body` read it: its answer then goes
        through `recorded`."""
        return provider_objects.created_by_body(path, document)

    async def _check(self, user: str, provider: Provider, kind: str, object_id: str, param: str | None = None
                     ) -> None:
        writing = self._writing.get((provider, object_id))
        if writing is not None:
            await asyncio.shield(writing)
        try:
            owner = await self._store.owner_of(provider, object_id)
        except StoreError as exc:
            log.warning("cannot read who owns a provider object: %s", exc)
            raise OwnershipUnavailable("memproxy cannot check who owns that object now; retry later") from None
        if owner != user:
            # The same answer for another user's object and for one that does not exist: no
            # one learns which ids are taken.
            raise ProviderObjectNotFound(f"{kind.replace('_', ' ').capitalize()} with id '{object_id}' not found.",
                                         param=param)

    def recorded(self, response: Any, user: str, provider: Provider, kind: str, *, listing: bool = False) -> Any:
        """`response` relayed as it comes, the id of the object it created recorded as `user`'s
        (`listing`: the answer of a GET, see `record`)."""
        return Recorded(response, self, user, provider, kind, listing)

    async def record(self, user: str, provider: Provider, objects: list[tuple[str, str]], *,
                     listing: bool = False) -> None:
        """Record `user` as the creator of `objects` ((kind, id) each), waiting at most
        memory.commit_timeout_ms for it.

        `listing`: the objects a GET's answer shows. A GET creates nothing, so most of what it
        shows was recorded when it was created or listed before: those are read, and only the
        rest written (on SQLite a write waits for the file's one write lock, behind every
        process's memory writes)."""
        if listing:
            objects = await self._unrecorded(user, provider, objects)
        kinds: dict[str, str] = {}
        for kind, object_id in objects:
            if (provider, object_id) not in self._writing:
                kinds.setdefault(object_id, kind)
        objects = [(kind, object_id) for object_id, kind in kinds.items()]
        if not objects:
            return
        task = asyncio.create_task(self._write_all(user, provider, objects))
        for _, object_id in objects:
            self._writing[provider, object_id] = task

        def written(_: asyncio.Task[None]) -> None:
            for _kind, object_id in objects:
                self._writing.pop((provider, object_id), None)

        task.add_done_callback(written)
        try:
            await asyncio.wait_for(asyncio.shield(task), self._wait_s)
        except TimeoutError:
            log.warning("recording who created a provider %s is slow; the answer goes on, the record after",
                        objects[0][0])

    async def _unrecorded(self, user: str, provider: Provider, objects: list[tuple[str, str]]
                          ) -> list[tuple[str, str]]:
        """Those of `objects` no one is recorded as the creator of (all of them when the store
        cannot say: the write then records what it must, or fails as it would have)."""
        try:
            owners = await self._store.owners_of(provider, [object_id for _, object_id in objects])
        except StoreError:
            return objects
        for kind, object_id in objects:
            if owners.get(object_id, user) != user:
                log.error("a provider %s created for one user was recorded as another's; it stays theirs", kind)
        return [(kind, object_id) for kind, object_id in objects if object_id not in owners]

    async def _write_all(self, user: str, provider: Provider, objects: list[tuple[str, str]]) -> None:
        for attempt in range(1, RECORD_ATTEMPTS + 1):
            try:
                owners = await self._store.record_owners(provider, user, objects, datetime.now(UTC))
                break
            except StoreError as exc:
                if exc.transient and attempt < RECORD_ATTEMPTS:
                    await asyncio.sleep(RECORD_RETRY_S)
                    continue
                # The objects exist at the provider; unrecorded, no one reaches them through memproxy.
                log.error("could not record who created a provider %s: %s", objects[0][0], exc)
                return
        for kind, object_id in objects:
            if owners[object_id] != user:
                log.error("a provider %s created for one user was recorded as another's; it stays theirs", kind)


class Recorded:
    """A creation's response: chunks as they come, the object's id recorded on the way."""

    def __init__(self, response: Any, ownership: Ownership, user: str, provider: Provider, kind: str,
                 listing: bool) -> None:
        self._inner = response
        self.response = response.response
        self.status = response.status
        self.content_type = response.content_type
        self._ownership = ownership
        self._owner = (user, provider, kind)
        self._listing = listing

    async def chunks(self) -> AsyncIterator[bytes]:
        if not 200 <= self.status < 300:
            async for chunk in self._inner.chunks():
                yield chunk
        elif is_readable_sse(self._inner):
            async for chunk in self._stream():
                yield chunk
        else:
            async for chunk in self._json():
                yield chunk

    async def _stream(self) -> AsyncIterator[bytes]:
        """Each chunk held until what its events show created is recorded: the response at its
        first event, an output item (and its container, the files it cites) as it comes."""
        decoder, inflate = SSEDecoder(), stream_inflater(self._inner)
        user, provider, kind = self._owner
        seen: set[tuple[str, str]] = set()
        async for chunk in self._inner.chunks():
            created = [each for event in decoder.feed(inflate(chunk) if inflate is not None else chunk)
                       for each in provider_objects.created_in_event(event.data, kind) if each not in seen]
            if created:
                seen.update(created)
                await self._ownership.record(user, provider, created)
            yield chunk

    async def _json(self) -> AsyncIterator[bytes]:
        """The body with its last chunk held until the id it carries is recorded."""
        body: list[bytes] = []
        size, held = 0, None
        async for chunk in self._inner.chunks():
            if held is not None:
                yield held
            size += len(chunk)
            if size <= CREATED_BODY_MAX:
                body.append(chunk)
            elif body:
                body.clear()  # too long to read: what was kept goes now
            held = chunk
        user, provider, kind = self._owner
        created: list[tuple[str, str]] = []
        if size <= CREATED_BODY_MAX:
            whole = readable_body(self._inner, b"".join(body))
            created = provider_objects.created_objects(whole, kind)
        if created:
            await self._ownership.record(user, provider, created, listing=self._listing)
        # A list of items may be empty, and a spoken answer may be a tool call: nothing lost.
        if size > CREATED_BODY_MAX or kind not in (provider_objects.LISTED_ITEMS, provider_objects.AUDIO) and (
                not created or created[0][0] != kind):
            log.warning("a provider %s was created but its id could not be read from the answer; "
                        "no user reaches it through memproxy", self._owner[2])
        if held is not None:
            yield held

    async def aclose(self) -> None:
        await self._inner.aclose()
