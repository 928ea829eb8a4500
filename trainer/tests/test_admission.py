"""Admission without Ray: the lag bound, placement, re-runs, drops, consumption order and
resume from a saved state."""

from __future__ import annotations

import pytest

from parity.core.types import Trajectory
from parity.trainer.admission import Admission, AdmissionSettings, AdmissionState
from parity.trainer.config import TrainConfig
from parity.trainer.errors import RunStopped


def _settings(**kw: int) -> AdmissionSettings:
    base = {"groups_per_step": 2, "steps": 3, "max_lag": 0, "max_in_flight": 2,
            "min_group_episodes": 2, "max_dropped_in_a_row": 3} | kw
    return AdmissionSettings(**base)


def _group(g: int, failures: tuple[str | None, ...] = (None, None)) -> list[Trajectory]:
    return [Trajectory(f"g{g}", [1], [1], [0.0], [0], reward=float(m), failure=f)
            for m, f in enumerate(failures)]


def _start_all(adm: Admission, load: list[int], versions: list[int]) -> list[tuple[int, int]]:
    """Everything `place` starts, the load growing as the driver's would."""
    out = []
    while (start := adm.place(load, versions)) is not None:
        out.append(start)
        load[start[1]] += 1
    return out


def test_settings_of_a_config() -> None:
    cfg = TrainConfig.model_validate({"rollout": {"groups_per_step": 4,
                                                  "max_groups_in_flight": 3},
                                      "train": {"steps": 7, "mode": "sync"}})
    s = AdmissionSettings.of(cfg)
    assert (s.groups_per_step, s.steps, s.max_lag, s.max_in_flight) == (4, 7, 0, 3)


def test_the_lag_bound_starts_group_g_at_version_v_only_below_v_plus_lag_plus_1_steps() -> None:
    adm = Admission(_settings(steps=4, max_lag=1, max_in_flight=10))
    # version 0, lag 1, n 2: slots 0-3 only
    assert [adm.admits(g, 0) for g in range(6)] == [True] * 4 + [False] * 2
    assert [adm.admits(g, 1) for g in range(6)] == [True] * 6
    # one worker on version 0: groups 0-3 start, the least loaded of two gets each
    assert _start_all(adm, [0, 0], [0, 0]) == [(0, 0), (1, 1), (2, 0), (3, 1)]
    assert adm.pending() == 4 and adm.held([2, 2]) == {0, 1}
    # worker 1 acknowledges version 1: groups 4 and 5 go to it, 6 waits for version 2
    assert _start_all(adm, [2, 2], [0, 1]) == [(4, 1), (5, 1)]
    assert adm.pending() == 6 and adm.held([2, 4]) == {0, 1}
    assert _start_all(adm, [2, 4], [0, 2]) == [(6, 1), (7, 1)]
    # every group of the run (4 steps · 2) has started: nothing pending, nobody held
    assert adm.pending() is None and adm.held([0, 0]) == set()


def test_sync_mode_starts_one_step_ahead_at_most_and_respects_room() -> None:
    adm = Admission(_settings(max_in_flight=1))
    assert _start_all(adm, [0, 0, 0], [0, 0, 0]) == [(0, 0), (1, 1)]
    assert adm.held([1, 1, 0]) == {2}  # has room, held by the bound
    assert adm.held([1, 1, 1]) == set()  # no room anywhere: nobody held


def test_dropped_groups_are_replaced_and_the_bound_uses_the_slot() -> None:
    adm = Admission(_settings())
    assert _start_all(adm, [0], [0]) == [(0, 0), (1, 0)]
    adm.drop(1, "ValueError", "ValueError: boom")
    assert adm.next_groups() == [0, 2]
    assert adm.admits(2, 0) and not adm.admits(3, 0)  # group 2 has slot 1
    assert _start_all(adm, [1], [0]) == [(2, 0)]
    assert adm.state.cursor == 3
    # 3 steps of 2 groups plus the dropped one: groups 0-6 in all
    assert _start_all(adm, [0], [9]) == [(3, 0), (4, 0)]
    assert _start_all(adm, [0], [9]) == [(5, 0), (6, 0)]
    assert adm.pending() is None


def test_groups_to_run_again_go_first_oldest_first() -> None:
    adm = Admission(_settings(max_lag=2, max_in_flight=10))
    assert _start_all(adm, [0], [0]) == [(g, 0) for g in range(6)]
    adm.rerun([4, 1])
    adm.rerun([1, 3])
    assert adm.retry == [1, 3, 4]
    assert _start_all(adm, [0], [0]) == [(1, 0), (3, 0), (4, 0)]
    assert adm.state.cursor == 6 and adm.pending() is None


def test_a_group_with_too_few_usable_episodes_is_dropped_and_drops_in_a_row_stop_the_run() -> None:
    adm = Admission(_settings(max_in_flight=10, max_lag=5))
    _start_all(adm, [0], [0])
    assert adm.finished(0, _group(0, (None, "sandbox"))) == (
        "1 of 2 episodes failed (sandbox: 1), fewer than train.min_group_episodes = 2 left")
    adm.drop(0, "env_failures", "why")
    adm.drop(1, "ValueError", "why")
    assert adm.finished(2, _group(2)) is None  # a kept group ends the run of drops
    assert adm.dropped_in_a_row == 0
    adm.drop(3, "ValueError", "a")
    adm.drop(4, "ValueError", "b")
    with pytest.raises(RunStopped) as e:
        adm.drop(5, "ValueError", "ValueError: c")
    assert str(e.value) == ("3 groups in a row were dropped (train.max_dropped_in_a_row = 3); "
                            "the last: ValueError: c")
    assert adm.state.dropped == {0: "env_failures", 1: "ValueError", 3: "ValueError",
                                 4: "ValueError", 5: "ValueError"}


def test_steps_consume_groups_in_index_order_dropped_ones_counted() -> None:
    adm = Admission(_settings(max_in_flight=10, max_lag=5))
    _start_all(adm, [0], [0])
    adm.finished(2, _group(2))
    adm.finished(0, _group(0, (None, "timeout", None)))  # trains on 2 of its 3
    assert not adm.batch_ready()  # group 1 is still running
    assert adm.finished(1, _group(1, ("sandbox", None))) is not None
    adm.drop(1, "env_failures", "why")
    assert adm.next_groups() == [0, 2] and adm.batch_ready()
    batch = adm.take()
    assert [[t.reward for t in g] for g in batch.groups] == [[0.0, 2.0], [0.0, 1.0]]
    assert [(t.group_id, t.failure) for t in batch.episodes] == [
        ("g0", None), ("g0", "timeout"), ("g0", None), ("g1", "sandbox"), ("g1", None),
        ("g2", None), ("g2", None)]
    assert adm.state.consumed == 3 and adm.state.done == {}
    assert adm.next_groups() == [3, 4]


def test_resume_from_a_saved_state_reruns_exactly_the_unfinished_groups() -> None:
    adm = Admission(_settings(max_in_flight=10, max_lag=5))
    assert len(_start_all(adm, [0], [0])) == 6  # every group the run needs
    adm.finished(0, _group(0))
    adm.finished(1, _group(1))
    adm.take()
    adm.finished(3, _group(3))
    adm.drop(4, "ValueError", "why")
    saved = adm.saved()
    assert saved == AdmissionState(cursor=6, consumed=2, dropped={4: "ValueError"},
                                   done={3: _group(3)})
    adm.finished(5, _group(5))  # after the checkpoint: not in it
    assert saved.done == {3: _group(3)}
    again = Admission(_settings(max_in_flight=10, max_lag=5), saved)
    assert again.retry == [2, 5]  # started, neither finished nor dropped at the checkpoint
    assert _start_all(again, [0], [0]) == [(2, 0), (5, 0), (6, 0)]
    assert again.pending() is None  # 3·2 groups + 1 dropped
    assert again.next_groups() == [2, 3]
