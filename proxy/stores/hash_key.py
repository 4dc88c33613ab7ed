"""The key the store's digests of text are kept under (docs/security.md).

Some digests memproxy keeps are of text before redaction: the answer as the client received it
(the conversation is found by it), the history a retry repeats (and the turn key made from it),
a Gemini call's id made from its arguments. Kept as plain sha256 beside the redacted copy, the
copy shows where a secret was and a dictionary pass finds it; kept as HMAC-SHA256 under a key
the store does not hold, they tell nothing without the key.

The key is `store.hash_key` when set (the same on every replica: PostgreSQL needs it), else,
with SQLite, a file beside the database made once (`memproxy.db.key`, mode 0600) and read by
every process on that file.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
from pathlib import Path

from proxy.settings import ConfigError, StoreSettings, require_hash_key

KEY_FILE_SUFFIX = ".key"
_KEY_BYTES = 32
_KEY_FILE_TEXT = re.compile(r"[0-9a-f]{64}\n?")

log = logging.getLogger("memproxy.store")


class HashKey:
    """Seals the digests kept of text before redaction.

    A key file that cannot be read yet (its directory not there: the store cannot open either,
    and memory is degraded) is tried again at each seal; meanwhile each seal is random, so what
    is queued for the store then matches nothing later and tells nothing.
    """

    def __init__(self, key: bytes | None = None, *, file: Path | None = None) -> None:
        self._key = key
        self._file = file

    def seal(self, digest: str) -> str:
        """HMAC-SHA256 hex of `digest` (a sha256 hex of the text, or an id made from it)."""
        key = self._key if self._key is not None else self._load()
        if key is None:
            return secrets.token_hex(_KEY_BYTES)
        return hmac.new(key, digest.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()

    def _load(self) -> bytes | None:
        if self._file is None:
            return None
        try:
            self._key = key_file(self._file)
        except OSError:
            pass  # the store cannot open either, and says so
        except ConfigError as exc:
            log.error("%s", exc)
        return self._key


def load_hash_key(settings: StoreSettings) -> HashKey:
    """`store.hash_key`, else the SQLite database's key file (made if missing). A PostgreSQL store
    without the setting, or a damaged key file, stops start-up."""
    require_hash_key(settings)
    if settings.hash_key is not None:
        return HashKey(settings.hash_key.encode())
    assert settings.sqlite_path is not None  # require_hash_key: only SQLite goes without the setting
    path = Path(f"{settings.sqlite_path}{KEY_FILE_SUFFIX}")
    try:
        return HashKey(key_file(path), file=path)
    except OSError as exc:
        log.error("store.hash_key: %s; until the key file can be read, each digest is random (a retry or a "
                  "tool loop's next step is a new turn)", exc)
        return HashKey(file=path)


def key_file(path: Path) -> bytes:
    """The key in `path`, written first when there is none (OSError: neither can be done)."""
    if not path.exists():
        _make(path)
    text = path.read_text("ascii", errors="replace")
    if not _KEY_FILE_TEXT.fullmatch(text):
        raise ConfigError(f"store.hash_key: {path} does not hold a key (64 hex digits); restore it from the "
                          "backup it was kept with, or set store.hash_key")
    return bytes.fromhex(text.strip())


def _make(path: Path) -> None:
    """Processes starting together on one database race to make the file: each writes a whole
    file of its own and links it into place; the first link wins and the others read it."""
    draft = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w") as out:
            out.write(secrets.token_hex(_KEY_BYTES) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.link(draft, path)
    except FileExistsError:
        pass  # another process made it first
    finally:
        draft.unlink(missing_ok=True)
