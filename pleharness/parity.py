"""Canonical token hashing (first divergent position: :func:`pleharness.divergence.first_divergence`).

Canonical encoding (written down once, used everywhere): a list of token IDs is encoded as the
concatenation of each ID as an unsigned 32-bit little-endian integer, with nothing before or after;
the hash is the lowercase hex SHA256 of those bytes. The empty list hashes to SHA256 of no bytes.

Example: [1, 2, 3] -> bytes 01000000 02000000 03000000 ->
``4636993d3e1da4e9d6b8f87b79e8f7c6d018580d52661950eabc3845c5897a4d`` (see tests/test_parity.py for the full known vector).
"""
from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence


def encode_ids(ids: Sequence[int]) -> bytes:
    """Canonical byte encoding of token IDs (uint32 little-endian each).

    Raises ValueError for an ID outside [0, 2**32).
    """
    try:
        return struct.pack(f"<{len(ids)}I", *ids)
    except struct.error as exc:
        raise ValueError(f"token IDs must be integers in [0, 2**32): {exc}") from None


def token_hash(ids: Sequence[int]) -> str:
    """SHA256 (hex) of the canonical encoding of ``ids``."""
    return hashlib.sha256(encode_ids(ids)).hexdigest()
