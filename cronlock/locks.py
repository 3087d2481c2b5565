"""Advisory lock keys: pure functions of names, identical in every process and on every host.

PostgreSQL's two-key advisory locks take two int4 values: a namespace and a key. Both are
derived from names with BLAKE2b (never Python's ``hash()``, which is salted per process: two
hosts would compute two keys and their runs would overlap). The mapping is part of the
on-disk contract: changing it would let an old and a new deployment run the same task at
once, so tests pin known values.
"""

from __future__ import annotations

import hashlib

__all__ = ["lock_key", "namespace_key"]


def _int4(text: str) -> int:
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


def namespace_key(namespace: str | int) -> int:
    """The int4 namespace for a named namespace (an int is taken as it is, if it fits)."""
    if isinstance(namespace, int):
        if not -(2**31) <= namespace < 2**31:
            raise ValueError(f"lock namespace {namespace} does not fit in int4")
        return namespace
    return _int4("cronlock-namespace:" + namespace)


def lock_key(name: str) -> int:
    """The int4 lock key of a name within its namespace."""
    return _int4("cronlock-key:" + name)
