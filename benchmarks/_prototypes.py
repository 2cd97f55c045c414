"""Monkeypatched prototypes of fixes to the harness client, for measuring their effect in the
benchmark scripts. Nothing here changes pleharness's files; each patch is undone by its context
manager.

``keepalive()``: ``EngineClient._stream`` (pleharness/engine/client.py) stops reading at the
``data: [DONE]`` event (``break``), before the HTTP chunked terminator ``0\\r\\n\\r\\n``. requests then
sees an unconsumed body, and ``Response.close()`` closes the socket instead of handing it back to
the pool, so EVERY completion opens a new TCP connection (and the server accepts a new one). The
patch makes the ``iter_lines`` generator read the rest of the body when its consumer stops right
after ``[DONE]`` (the proposed fix: keep reading to the end of the stream after [DONE], e.g.
``continue`` instead of ``break`` or ``for _ in it: pass`` before ``resp.close()``), so the
connection is reused.
"""
from __future__ import annotations

import contextlib

import requests


@contextlib.contextmanager
def keepalive():
    orig = requests.models.Response.iter_lines

    def iter_lines(self, *args, **kwargs):
        it = orig(self, *args, **kwargs)
        last = None
        try:
            for line in it:
                last = line
                yield line
        finally:
            if last is not None and last.strip() == b"data: [DONE]":
                try:
                    for _ in it:  # only the chunked terminator is left
                        pass
                except requests.RequestException:
                    pass

    requests.models.Response.iter_lines = iter_lines
    try:
        yield
    finally:
        requests.models.Response.iter_lines = orig
