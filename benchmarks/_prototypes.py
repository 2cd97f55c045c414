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


@contextlib.contextmanager
def no_env_lookup():
    """``EngineClient.session`` (pleharness/engine/client.py) makes a ``requests.Session`` with
    ``trust_env=True`` (the default), so every request runs ``merge_environment_settings`` →
    ``get_environ_proxies`` → ``urllib.request.getproxies_environment`` + ``proxy_bypass``, which scan
    the whole ``os.environ`` twice (about 12 % of the client's profiled time). The patch sets
    ``trust_env = False`` on the sessions the client makes (proposed fix: do that in
    ``EngineClient.session``, or resolve proxies once per client and pass ``proxies=`` explicitly;
    a local engine needs no proxy)."""
    from pleharness.engine.client import EngineClient

    orig = EngineClient.session

    def session(self):
        s = orig.fget(self)
        s.trust_env = False
        return s

    EngineClient.session = property(session)
    try:
        yield
    finally:
        EngineClient.session = orig


@contextlib.contextmanager
def all_fixes():
    with keepalive(), no_env_lookup():
        yield


PROTOTYPES = {"keepalive": keepalive, "no_env_lookup": no_env_lookup, "all": all_fixes}
