"""The public surface is exactly ``cronlock.__all__`` (as httpx asserts its own)."""

from __future__ import annotations

import cronlock


def test_all_is_sorted_and_complete() -> None:
    public = sorted(name for name in vars(cronlock) if not name.startswith("_"))
    submodules = {name for name in public if type(getattr(cronlock, name)).__name__ == "module"}
    assert cronlock.__all__ == sorted(cronlock.__all__)
    assert sorted(set(public) - submodules - {"annotations"}) == cronlock.__all__


def test_public_names_belong_to_cronlock() -> None:
    for name in cronlock.__all__:
        assert getattr(cronlock, name).__module__ == "cronlock", name


def test_errors_have_one_base_and_default_messages() -> None:
    for name in cronlock.__all__:
        obj = getattr(cronlock, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, cronlock.CronlockError)
            assert str(obj()) == (obj.__doc__ or "").strip()
