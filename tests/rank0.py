"""Rank 0's services as its performer runs them, for tests without a broker: each `Apply` a
service returns is taken through the one path (overlay/services/rankpath.py), its follow-ups and
then the service's continuation put in its place, as overlay/broker/perform.py does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from tbon.overlay.services.actions import Action, Apply
from tbon.overlay.services.rankpath import RankPath
from tbon.overlay.state.ranktable import Event, RankTable, Reserve

Service = TypeVar("Service")


def performed(path: RankPath, actions: list[Action], now: float) -> list[Action]:
    """`actions` with every Apply carried out on `path` at `now`, in order; the rest as given."""
    done: list[Action] = []
    for action in actions:
        if not isinstance(action, Apply):
            done.append(action)
            continue
        applied = path.handle(action.event, now)
        done += performed(path, applied.actions, now)
        if action.then is not None:
            done += performed(path, action.then(applied.outcome, now), now)
    return done


def report(path: RankPath, event: Event | Reserve, now: float) -> list[Action]:
    """What rank 0 does with one event a link saw (Broker.report): apply it on the path."""
    return performed(path, [Apply(event)], now)


class AtRank0(Generic[Service]):
    """A rank-0 service whose handlers' Apply actions are carried out on `path`: a handler
    called with the time last (`handle(request, now)`, `expire(now)`) returns what is left."""

    def __init__(self, service: Service, path: RankPath) -> None:
        self.service = service
        self.path = path

    @staticmethod
    def of(make: Callable[[RankTable], Service], table: RankTable) -> AtRank0[Service]:
        return AtRank0(make(table), RankPath(table))

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.service, name)
        if not callable(found):
            return found

        def carried(*args: Any) -> Any:
            result = found(*args)
            now = args[-1] if args else None
            if isinstance(result, list) and isinstance(now, int | float):
                return performed(self.path, result, float(now))
            return result

        return carried
