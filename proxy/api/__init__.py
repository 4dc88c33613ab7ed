"""The memory API under /memory/v1: see, correct, export, import and erase a user's memory."""
