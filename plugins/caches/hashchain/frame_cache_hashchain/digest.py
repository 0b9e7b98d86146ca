"""Block digests: a cryptographic hash of (parent block's digest, the block's token ids, extra keys).

The digest of block ``i`` folds in the digest of block ``i - 1``, so equal digests mean equal whole prefixes
(up to a collision, which :class:`~frame_cache_hashchain.strategy.HashChainCache` still guards against by
comparing stored token ids). Python's ``hash()`` is never used: it is salted per process and 64 bits wide.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence

#: ``(parent digest or None for the first block, token ids, extra keys) -> digest``
DigestFn = Callable[[bytes | None, Sequence[int], tuple[str, ...]], bytes]

#: Algorithms the ``hash_algorithm`` option accepts (all guaranteed present in :mod:`hashlib`).
ALGORITHMS = ("sha256", "sha384", "sha512", "blake2b", "sha3_256")


def make_block_digest(algorithm: str = "sha256") -> DigestFn:
    """Return the digest function for ``algorithm``; raises ValueError for one not in :data:`ALGORITHMS`."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown hash algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")

    def block_digest(parent: bytes | None, token_ids: Sequence[int], extra_keys: tuple[str, ...]) -> bytes:
        h = hashlib.new(algorithm)
        # Every field is tagged or length-prefixed so that no two different inputs share an encoding.
        h.update(b"\x00" if parent is None else b"\x01" + parent)
        h.update(struct.pack(f"<I{len(token_ids)}q", len(token_ids), *token_ids))
        h.update(struct.pack("<I", len(extra_keys)))
        for key in extra_keys:
            raw = key.encode("utf-8")
            h.update(struct.pack("<I", len(raw)) + raw)
        return h.digest()

    return block_digest


block_digest: DigestFn = make_block_digest("sha256")
