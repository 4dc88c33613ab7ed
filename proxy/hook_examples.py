"""Example hooks (config/hooks.yaml, docs/hooks.md): policies a deployment adds without forking memproxy.

Each takes the hook's input (a dict) and returns its answer (a dict, or None for no opinion).
"""

from __future__ import annotations

import re
from typing import Any

# A medical record number as a hospital writes it; turns that mention one stay out of memory.
PATIENT_ID = re.compile(r"\bMRN-\d{6}\b")


def keep_patient_ids_out(event: dict[str, Any]) -> dict[str, Any] | None:
    """pre_memory_write: block any save that mentions a patient id (the model still answers)."""
    if any(PATIENT_ID.search(turn["content"]) for turn in event["turns"]):
        return {"decision": "block"}
    return None


def mask_patient_ids(event: dict[str, Any]) -> dict[str, Any] | None:
    """pre_memory_write, the gentler policy: save the turn with each patient id masked."""
    turns = [{**turn, "content": PATIENT_ID.sub("MRN-######", turn["content"])} for turn in event["turns"]]
    return {"updated_turns": turns} if turns != event["turns"] else None


async def no_opinion(event: dict[str, Any]) -> None:
    """Any event: a hook with nothing to say (what `bench/overhead.py --hooks` measures the cost of)."""
    return None
