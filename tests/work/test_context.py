"""The run's context: the pacer that spaces starts (`--rpm`)."""

from __future__ import annotations

from imagebatch.run.pacing import Pacer


def test_the_pacer_spaces_starts() -> None:
    now = [0.0]
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)

    pacer = Pacer(2.0, sleep=sleep, clock=lambda: now[0])
    assert [pacer.wait() for _ in range(3)] == [0.0, 2.0, 4.0]  # three starts asked for at once
    now[0] = 10.0
    assert pacer.wait() == 0.0 and waits == [2.0, 4.0]
