"""`memproxy setup AGENT`: write a coding agent's own configuration so it goes through memproxy.

Each agent is one small module (`claude_code.py`, `codex.py`, `gemini_cli.py`) that names the files it edits
and the keys it sets; `documents.py` reads and writes JSON (as text, `json_text.py`), TOML and `.env` files
keeping the rest of a file; `edits.py` plans and writes the change (atomically, the file's mode kept); `undo.py`
keeps what --undo needs in memproxy's own state directory, and undoes; `command.py` is the
command line. It may import the settings, ids and redaction (to mask keys it shows); only the
command line imports it (import-linter holds it).
"""

# The agents `memproxy setup` knows, for the command line's help (command.AGENTS holds their
# modules; importing those costs the command line half a second, so only `setup` does).
AGENT_NAMES = ("claude-code", "codex", "gemini-cli")
