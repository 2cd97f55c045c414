"""Helpers shared by several scenario kinds (not kinds themselves, nothing registers here).

- :mod:`.chat`: exact-length chat prompts (``ChatParams``, ``ChatScenario``, ``boundary_spec``).
- :mod:`.inserting`: inserts into a running streamed decode.
- :mod:`.lengths`: the boundary lengths derived from the engine facts (q, n*B + q, n*C + q, ...).
- :mod:`.stops`: stops taken from the engine's output (``stop_id``, ``stop_for``).
"""
