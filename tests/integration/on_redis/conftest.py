"""Keep only the imported tests that reach Redis through ``any_redis``: the rest ran under tests/unit."""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        mine = Path(str(item.path)).parent == HERE
        needs = {"any_redis", "emptied_any_redis"} & set(getattr(item, "fixturenames", ()))
        (drop if mine and not needs else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
