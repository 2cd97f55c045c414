import hashlib
import struct

import pytest
from hypothesis import given, strategies as st

from pleharness.divergence import first_divergence
from pleharness.parity import encode_ids, token_hash


def test_known_vector():
    # [1, 2, 3] as uint32 little-endian: 01000000 02000000 03000000
    assert encode_ids([1, 2, 3]) == bytes.fromhex("010000000200000003000000")
    assert token_hash([1, 2, 3]) == \
        "4636993d3e1da4e9d6b8f87b79e8f7c6d018580d52661950eabc3845c5897a4d"
    assert token_hash([]) == hashlib.sha256(b"").hexdigest()


def test_order_and_width_matter():
    assert token_hash([1, 2]) != token_hash([2, 1])
    # a naive byte encoding would confuse [1, 256] with [1, 0, 1]
    assert token_hash([256]) != token_hash([0, 1])


def test_out_of_range_ids_raise():
    with pytest.raises(ValueError):
        encode_ids([-1])
    with pytest.raises(ValueError):
        encode_ids([2**32])


@given(st.lists(st.integers(0, 2**32 - 1), max_size=50))
def test_encoding_roundtrip(ids):
    b = encode_ids(ids)
    assert list(struct.unpack(f"<{len(ids)}I", b)) == ids


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2
    assert first_divergence([], [5]) == 0


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=30), st.data())
def test_first_divergence_finds_the_flip(ids, data):
    pos = data.draw(st.integers(0, len(ids) - 1))
    flipped = list(ids)
    flipped[pos] += 1
    assert first_divergence(ids, flipped) == pos
    assert token_hash(ids) != token_hash(flipped)
