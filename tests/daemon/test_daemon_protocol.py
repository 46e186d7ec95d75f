"""The daemon's frame decoder: round trips, and hostile bytes only ever raise ProtocolError.

No daemon here: these drive the same FrameDecoder the daemon and its clients read with.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dgemma_lsp.engine.api import DenoiseRequest, Draft, EngineStatus, GenerationSettings, InfillContext
from dgemma_lsp.engine.daemon.protocol import (
    HEADER_BYTES,
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    Cancel,
    DraftFrame,
    EngineKey,
    Failed,
    Hello,
    InfoQuery,
    Load,
    ProtocolError,
    Shutdown,
    StatusFrame,
    Submit,
    Welcome,
    client_decoder,
    daemon_decoder,
    encode_frame,
)

REQUEST = DenoiseRequest(
    context=InfillContext(prefix="def f(x):\n    return ", suffix="\n", language="python"),
    settings=GenerationSettings(steps=3, seed=1),
    priority=2,
)
NEXT_EDIT = DenoiseRequest(
    context=InfillContext(prefix="def f(y):\n", suffix="", language="python"), selection="    return x\n",
    strength=0.4, rewrite_keep="both", recent_edits="--- a/f.py\n+++ b/f.py\n@@ -1,1 +1,1 @@\n-def f(x):\n+def f(y):\n",
)
"""A next edit: a rewrite whose prompt carries the recent edits (engine/nextedit/)."""
CLIENT_MESSAGES = [
    Hello(version=PROTOCOL_VERSION, token="t" * 43, engine=EngineKey(model="tiny-random"), pid=12, name="lsp"),
    Submit(id=1, request=REQUEST),
    Submit(id=2, request=NEXT_EDIT),
    Cancel(id=1),
    Load(),
    InfoQuery(id=7),
    Shutdown(),
]
DAEMON_MESSAGES = [
    Welcome(version=PROTOCOL_VERSION, pid=3, status=EngineStatus(state="idle", model="tiny-random")),
    DraftFrame(id=1, draft=Draft(step=1, text="ret😀")),
    Failed(id=1, kind="cancelled", message="cancelled after 1 step"),
    StatusFrame(status=EngineStatus(state="ready", model="tiny-random", device="cpu", loads=1)),
]
STREAM = b"".join(encode_frame(m) for m in CLIENT_MESSAGES)


def test_every_message_round_trips_through_its_decoder():
    assert client_decoder().feed(STREAM) == CLIENT_MESSAGES
    assert daemon_decoder().feed(b"".join(encode_frame(m) for m in DAEMON_MESSAGES)) == DAEMON_MESSAGES


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_split_of_a_valid_stream_yields_the_same_messages(cuts):
    decoder, messages, last = client_decoder(), [], 0
    for cut in sorted(cuts) + [len(STREAM)]:
        messages += decoder.feed(STREAM[last:cut])
        last = cut
    assert messages == CLIENT_MESSAGES
    assert decoder.pending_bytes == 0


@given(st.integers(min_value=0, max_value=len(STREAM) - 1))
def test_a_truncated_stream_yields_only_its_whole_frames_and_waits(length):
    decoder = client_decoder()
    messages = decoder.feed(STREAM[:length])
    assert messages == CLIENT_MESSAGES[: len(messages)]
    assert decoder.pending_bytes == length - sum(len(encode_frame(m)) for m in messages)


@settings(max_examples=400)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_random_bytes_never_crash_the_decoder(chunks):
    for decoder in (client_decoder(), daemon_decoder()):
        try:
            for chunk in chunks:
                decoder.feed(chunk)
        except ProtocolError:
            with pytest.raises(ProtocolError):  # a broken stream stays broken
                decoder.feed(b"")


@settings(max_examples=200)
@given(st.binary(max_size=256))
def test_any_payload_in_a_well_formed_frame_is_a_message_or_a_protocol_error(payload):
    frame = len(payload).to_bytes(HEADER_BYTES, "big") + payload
    for decoder in (client_decoder(), daemon_decoder()):
        try:
            messages = decoder.feed(frame)
        except ProtocolError:
            continue
        assert len(messages) == 1


@given(st.integers(min_value=MAX_FRAME_BYTES + 1, max_value=2**32 - 1))
def test_an_oversized_length_is_refused_before_its_payload_arrives(length):
    with pytest.raises(ProtocolError):
        client_decoder().feed(length.to_bytes(HEADER_BYTES, "big") + b"\x80")


def test_a_daemon_message_sent_to_the_daemon_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        client_decoder().feed(encode_frame(DAEMON_MESSAGES[1]))


def test_a_valid_msgpack_value_of_the_wrong_shape_is_a_protocol_error():
    payload = msgspec.msgpack.encode({"type": "submit", "id": "not an int", "request": {}})
    with pytest.raises(ProtocolError):
        client_decoder().feed(len(payload).to_bytes(HEADER_BYTES, "big") + payload)


def test_encoding_refuses_a_frame_over_the_limit():
    huge = Submit(id=1, request=DenoiseRequest(context=InfillContext(prefix="x" * (MAX_FRAME_BYTES + 1), suffix="")))
    with pytest.raises(ProtocolError):
        encode_frame(huge)
