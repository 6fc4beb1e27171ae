"""The CUDA-event timer's three views (iosim.measure.events), driven by a fake clock: what each view queues, in
which order, and which median it returns. No GPU: the fake's events read a counter that the timed calls move."""

from __future__ import annotations

import pytest

from iosim.measure.events import BUSY, CALLER, ISOLATED, VIEWS, Clock, cupy_clock, time_ms


class _Fake:
    """A device whose clock moves only when a timed call runs; every operation is logged in order."""

    def __init__(self, durations):
        self.now, self.log, self.durations = 0.0, [], list(durations)

    def clock(self, spin=True) -> Clock:
        fake = self

        class Event:
            def record(self):
                self.t = fake.now
                fake.log.append("record")

            def synchronize(self):
                fake.log.append("event-sync")

        return Clock(event=Event, elapsed_ms=lambda a, b: b.t - a.t,
                     synchronize=lambda: self.log.append("device-sync"),
                     spin=(lambda: self.log.append("spin")) if spin else None)

    def fn(self):
        self.log.append("call")
        self.now += self.durations.pop(0)


@pytest.mark.parametrize("view", VIEWS)
def test_the_median_of_the_timed_calls_only(view):
    fake = _Fake([100.0, 100.0, 5.0, 1.0, 3.0])  # two warm-up calls, then three timed
    assert time_ms(fake.fn, 3, warmup=2, view=view, clock=fake.clock()) == 3.0
    assert fake.log.count("call") == 5


def test_busy_spins_once_after_the_warm_up_and_before_the_first_timed_call():
    fake = _Fake([9.0, 1.0, 2.0])
    time_ms(fake.fn, 2, warmup=1, view=BUSY, clock=fake.clock())
    assert fake.log == ["call", "device-sync", "spin", "record", "call", "record", "record", "call", "record",
                        "device-sync"]


def test_the_callers_view_queues_the_calls_back_to_back_without_a_spin():
    fake = _Fake([9.0, 1.0, 2.0])
    time_ms(fake.fn, 2, warmup=1, view=CALLER, clock=fake.clock(spin=False))
    assert fake.log == ["call", "device-sync", "record", "call", "record", "record", "call", "record", "device-sync"]


def test_isolated_waits_for_each_call_and_not_for_the_warm_up():
    fake = _Fake([9.0, 1.0, 2.0])
    time_ms(fake.fn, 2, warmup=1, view=ISOLATED, clock=fake.clock(spin=False))
    assert fake.log == ["call", "record", "call", "record", "event-sync", "record", "call", "record", "event-sync"]


def test_an_even_count_of_calls_gives_the_mean_of_the_middle_two():
    fake = _Fake([4.0, 1.0, 2.0, 8.0])
    assert time_ms(fake.fn, 4, warmup=0, view=CALLER, clock=fake.clock()) == 3.0


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"view": "gpu"}, "expected one of busy, caller, isolated"),
    ({"reps": 0}, "at least one timed call"),
    ({"view": BUSY, "spin": False}, "needs a clock with a spin kernel"),
])
def test_what_the_timer_refuses(kwargs, words):
    fake = _Fake([])
    spin = kwargs.pop("spin", True)
    kwargs.setdefault("reps", 1)
    with pytest.raises(ValueError, match=words):
        time_ms(fake.fn, warmup=0, clock=fake.clock(spin=spin), **kwargs)
    assert fake.log == []  # refused before any call


def test_cupy_clock_takes_cupys_names():
    class Cuda:
        Event = object
        get_elapsed_time = staticmethod(lambda a, b: 7.0)
        runtime = type("runtime", (), {"deviceSynchronize": staticmethod(lambda: None)})

    cp = type("cp", (), {"cuda": Cuda})
    clock = cupy_clock(cp)
    assert clock.spin is None and clock.event is object and clock.elapsed_ms(1, 2) == 7.0
    assert clock.synchronize is Cuda.runtime.deviceSynchronize
