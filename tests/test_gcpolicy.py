"""services/gcpolicy.py: the oldest generation collected by the sessions' rhythm, not by
CPython's growth rule; what a frozen session leaves in cycles still freed."""
from __future__ import annotations

import asyncio
import gc
import logging
import weakref

import pytest

from services import introspect
from services.gcpolicy import CollectionPolicy, SessionCollections

log = logging.getLogger("test.gcpolicy")


class _Node:
    """A reference cycle of its own, as a session's objects are."""

    def __init__(self) -> None:
        self.me = self
        self.payload = [[i] for i in range(50)]


def _oldest_collections() -> int:
    return gc.get_stats()[2]["collections"]


@pytest.fixture
def restore_gc():
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    gc.enable()
    yield
    gc.set_threshold(*thresholds)
    gc.unfreeze()
    if not enabled:
        gc.disable()


def test_growth_does_not_trigger_a_full_collection_while_active(restore_gc):
    kept = []
    before = _oldest_collections()
    with SessionCollections(log):
        for _ in range(200_000):   # a quarter more than what survived: CPython's own trigger
            kept.append([None])
        during = _oldest_collections()
    assert during == before
    assert gc.get_threshold()[2] != 2 ** 31 - 1   # restored on leaving
    for _ in range(300_000):
        kept.append([None])
    assert _oldest_collections() > during   # and CPython's rule is back


def test_policies_that_overlap_restore_the_collector_whatever_order_they_stop(restore_gc):
    """Two policies of one process (a test running several transceivers and clients at once):
    the last to stop restores what the first found."""
    found = gc.get_threshold()
    first, second = SessionCollections(log), SessionCollections(log)
    first.start()
    second.start()
    first.stop()
    assert gc.get_threshold()[2] == 2 ** 31 - 1   # the second still holds it
    second.stop()
    assert gc.get_threshold() == found


def test_every_freeze_every_sessions_what_is_live_is_frozen(restore_gc):
    policy = CollectionPolicy(freeze_every=4)
    with SessionCollections(log, policy) as collections:
        frozen = gc.get_freeze_count()
        live = [_Node() for _ in range(100)]
        for _ in range(3):
            collections.session_started()
        assert gc.get_freeze_count() == frozen and collections.freezes == 0
        collections.session_started()
        assert collections.freezes == 1
        assert gc.get_freeze_count() >= frozen + 100 * 52
    assert gc.get_freeze_count() == 0
    del live


def test_a_frozen_sessions_cycles_are_freed_once_no_session_is_live(restore_gc):
    async def scenario() -> tuple[bool, bool, bool]:
        policy = CollectionPolicy(freeze_every=1, idle_s=0.05)
        with SessionCollections(log, policy) as collections:
            node = _Node()
            ref = weakref.ref(node)
            collections.session_started()
            await asyncio.sleep(0)           # the freeze runs on the loop's next turn
            del node
            gc.collect()                     # a collection that does not unfreeze: kept
            kept_frozen = ref() is not None
            collections.session_ended(live=1)
            await asyncio.sleep(0.1)
            kept_while_live = ref() is not None
            collections.session_ended(live=0)
            await asyncio.sleep(0.2)
            return kept_frozen, kept_while_live, ref() is None and collections.full_collections == 1

    assert asyncio.run(scenario()) == (True, True, True)


def test_a_session_starting_in_the_idle_wait_cancels_the_full_collection(restore_gc):
    async def scenario() -> int:
        policy = CollectionPolicy(freeze_every=100, idle_s=0.05)
        with SessionCollections(log, policy) as collections:
            collections.session_started()
            collections.session_ended(live=0)
            collections.session_started()
            await asyncio.sleep(0.15)
            return collections.full_collections

    assert asyncio.run(scenario()) == 0


def test_a_process_never_idle_collects_after_max_frozen_ended(restore_gc):
    policy = CollectionPolicy(freeze_every=1, max_frozen_ended=3)
    with SessionCollections(log, policy) as collections:
        node = _Node()
        ref = weakref.ref(node)
        collections.session_started()     # frozen (no loop: at once)
        del node
        collections.session_ended(live=10)
        collections.session_ended(live=10)
        assert ref() is not None and collections.full_collections == 0
        collections.session_ended(live=10)
        assert ref() is None and collections.full_collections == 1


def test_an_introspection_collection_frees_frozen_cycles_and_keeps_the_rest_frozen(restore_gc):
    with SessionCollections(log, CollectionPolicy(freeze_every=1)) as collections:
        node = _Node()
        ref = weakref.ref(node)
        collections.session_started()
        frozen = gc.get_freeze_count()
        del node
        introspect.snapshot(collect=True)
        assert ref() is None
        assert 0 < gc.get_freeze_count() < frozen


@pytest.mark.parametrize("kwargs", [{"freeze_every": 0}, {"max_frozen_ended": 0},
                                    {"idle_s": -1}])
def test_a_policy_that_cannot_work_is_refused(kwargs):
    with pytest.raises(ValueError):
        CollectionPolicy(**kwargs)
