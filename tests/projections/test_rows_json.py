"""`projections.rows.dumps`, the JSON of projection columns, is the text `json.dumps`
writes with sorted keys, compact separators and no ASCII escaping, for any JSON value
(its C encoder is built once; the checksums and the comparison with a rebuild depend
on the text being the same)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.core.rows import dumps

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


def reference(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@settings(max_examples=300, deadline=None)
@given(values)
def test_dumps_is_json_dumps_sorted_and_compact(value: Any) -> None:
    assert dumps(value) == reference(value)


@pytest.mark.parametrize(
    "value",
    [
        "plain",
        'é \u2028 \x00 "q"',
        10**30,
        -0.0,
        1e300,
        math.inf,
        {"b": 1, "a": [None, {"d": 2, "c": 3}]},
    ],
)
def test_dumps_edge_values(value: Any) -> None:
    assert dumps(value) == reference(value)


def test_dumps_refuses_what_json_cannot_write() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        dumps({"when": object()})
    with pytest.raises(TypeError):
        json.dumps({"when": object()})
