"""What a booking was planned from, and when that is gone (controller.state.bookings)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from controller.state.bookings import stale_templates, template_digest


def test_digest_ignores_key_order_and_sees_content() -> None:
    a = {"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"containers": [{"name": "c"}]}}
    b = {"spec": {"containers": [{"name": "c"}]}, "metadata": {"labels": {"b": "2", "a": "1"}}}
    assert template_digest(a) == template_digest(b)
    assert template_digest(a) != template_digest({**a, "spec": {"containers": []}})


@given(st.dictionaries(st.sampled_from("abcd"), st.sampled_from(["x", "y"]), min_size=1),
       st.dictionaries(st.sampled_from("abcde"), st.sampled_from(["x", "y", None])))
def test_stale_is_deleted_or_changed_of_the_recorded(
    recorded: dict[str, str], current: dict[str, str | None]
) -> None:
    deleted, changed = stale_templates(recorded, current)
    assert set(deleted) == {n for n in recorded if current.get(n) is None}
    assert set(changed) == {n for n in recorded
                            if current.get(n) is not None and current[n] != recorded[n]}
