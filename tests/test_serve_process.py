"""What `memproxy serve` does to the process it has to itself."""

from __future__ import annotations

import gc
from pathlib import Path

from proxy.settings import load_settings
from tests.conftest import RunningProxy
from tests.fake_upstream import FakeUpstream


def test_what_exists_once_served_is_frozen_out_of_garbage_collection(fake: FakeUpstream, tmp_path: Path) -> None:
    settings = load_settings(environ={}, overrides={"upstream.base_url": fake.url,
                                                    "store.url": f"sqlite:///{tmp_path}/memproxy.db"})
    before = gc.get_freeze_count()
    shared = RunningProxy(settings)  # an app sharing its process (as every other test's does) freezes nothing
    try:
        assert gc.get_freeze_count() == before
    finally:
        shared.stop()
    served = RunningProxy(settings, own_process=True)
    try:
        # Modules, the stemmer's tables, the app: tens of thousands of objects.
        assert gc.get_freeze_count() > before + 10_000
        answer = served.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert answer.choices[0].message.content == "Hello from upstream"
    finally:
        served.stop()
        gc.unfreeze()
