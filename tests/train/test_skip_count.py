"""trainer.max_skipped_steps counts skipped optimizer updates in a row, across steps."""

from __future__ import annotations

from toy_trainer import toy_state


def test_an_applied_update_resets_the_count_of_skipped_ones() -> None:
    st = toy_state()
    st.count_updates([False, False])  # a step of two updates, both skipped
    assert st.skipped_in_a_row == 2
    st.count_updates([False, True])  # one skipped, then one applied: the run of skips is broken
    assert st.skipped_in_a_row == 0
    st.count_updates([True, False])  # the trailing skip starts a new run
    st.count_updates([False])
    assert st.skipped_in_a_row == 2
    assert st.state_dict()["skipped_in_a_row"] == 2  # checkpointed, so a resumed run keeps counting
