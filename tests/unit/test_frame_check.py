"""The length check that runs before kio decodes a request (odradek.protocol.frame_check).

Valid requests of every API and version the broker advertises walk to their last byte; the native
walk and the Python reference agree on mutated ones (same end, or the same refusal); and a
request that passes the check decodes without kio allocating for lengths that are not there.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from odradek.protocol import frame_check
from odradek.protocol.codec import (
    ProtocolError,
    decode_request_body,
    parse_request_header,
    request_class,
)
from odradek.server.apis import SUPPORTED_VERSIONS
from tests.fuzz.generate import Names, random_request
from tests.fuzz.mutate import KINDS, mutate_frame

NAMES = Names(topics=("t", "fuzz-target"), groups=("g",))
PAIRS = [
    (api, v)
    for api, (low, high) in sorted(SUPPORTED_VERSIONS.items())
    for v in range(low, high + 1)
]


def test_the_native_walk_is_built() -> None:
    assert frame_check.NATIVE


@pytest.mark.parametrize(("api_key", "version"), PAIRS)
def test_valid_requests_walk_to_their_end(api_key: int, version: int) -> None:
    rng = random.Random(api_key * 100 + version)
    program = frame_check.compile_layout(request_class(api_key, version))
    for _ in range(25):
        payload = random_request(api_key, version, rng, NAMES, 7)[4:]
        header = parse_request_header(payload)
        assert frame_check.walk_reference(payload, header.size, program) == len(payload)
        frame_check.check_lengths(payload, header.size, request_class(api_key, version))
        decode_request_body(header, payload)


def outcome(function, *args):  # type: ignore[no-untyped-def]
    try:
        return function(*args)
    except ValueError as e:
        return ("refused", str(e))


@given(st.sampled_from(PAIRS), st.sampled_from(KINDS), st.integers(0, 2**32))
@settings(max_examples=3000, suppress_health_check=[HealthCheck.too_slow])
def test_native_and_reference_agree_on_mutated_requests(
    pair: tuple[int, int], kind: str, seed: int
) -> None:
    api_key, version = pair
    rng = random.Random(seed)
    frame = random_request(api_key, version, rng, NAMES, 7)
    header = parse_request_header(frame[4:])
    mutated = mutate_frame(frame, 4 + header.size, [b"t", b"fuzz-target", b"g"], rng, kind)
    payload = mutated[4:]
    program = frame_check.compile_layout(request_class(api_key, version))
    native = outcome(frame_check._native.check, payload, header.size, program)
    if isinstance(native, tuple):
        native = ("refused", native[1])
    assert native == outcome(frame_check.walk_reference, payload, header.size, program)
    # Whatever the check lets through, kio decodes or refuses without trouble.
    if not isinstance(native, tuple) and len(payload) >= header.size:
        try:
            decode_request_body(parse_request_header(payload), payload)
        except ProtocolError:
            pass


def test_a_huge_compact_array_is_refused() -> None:
    from tests.fuzz.test_regressions import FOUR_BILLION_ELEMENTS

    payload = FOUR_BILLION_ELEMENTS[4:]
    header = parse_request_header(payload)
    with pytest.raises(ProtocolError, match="more elements than there are bytes left"):
        decode_request_body(header, payload)
