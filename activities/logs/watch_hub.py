"""One watch shard's members (ADR 015): the jobs its hub polls, their subscriptions, and the compact state the
shard's activity heartbeats so that a retried attempt, on any worker, goes on where the last one stopped.

Membership is keyed by the subscribing workflow's id. A subscription with the same run and ``seq`` as a member is
a lease renewal (the hub keeps its own newer offsets and progress); a newer run or a higher ``seq`` replaces the
member; an older one is ignored. A member whose poll returns a result keeps it as a pending ``WatchEvent`` until
the signal is delivered, then leaves (one-shot, like the per-job activity returning).

Heartbeat details are taken at one instant per member (``JobWatcher``'s offsets and progress agree), so lines
re-read after a restore are exactly those the restored progress has not folded: none counts twice. They are
bounded: each rank's timing rings are cut to ``DETAILS_RING`` values, and past ``MAX_DETAILS_BYTES`` the largest
members' progress is left out (those jobs learn their timing afresh after a takeover; no line is lost). The
members travel as zlib-compressed JSON (``packed``; file paths repeat in every offset key), beside a plain
member count the Temporal UI shows.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import zlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError
from temporalio import activity

from activities.logs.job_logs import LogPolicy
from activities.logs.job_watcher import JobWatcher, PollStep, WatchState
from activities.logs.shard_view import ShardView
from workflows.constants import WATCH_FEED_APPLY_ACTIVITY
from workflows.domain.loop import JobWatchResult
from workflows.domain.progress import ProgressState
from workflows.domain.scheduler_feed import FeedUpdate
from workflows.domain.slurm import ClusterSnapshot
from workflows.domain.watch_hub import WatchEvent, WatchSubscription, WatchUnsubscribe

__all__ = ["DETAILS_RING", "MAX_DETAILS_BYTES", "MAX_PACKED_BYTES", "Member", "ShardHub", "compact_progress"]

log = logging.getLogger("rebound.watch_hub")

#: Values per timing ring kept in heartbeat details (the live state keeps its full ring): enough for the
#: straggler streaks to go on after a takeover; the p99s refill within a minute of steps.
DETAILS_RING = 8
#: Heartbeat details above this much JSON (before compression) are cut: first the largest members' progress,
#: then, only past ~2,000 jobs per shard, members themselves (logged: raise ``watch.shards``).
MAX_DETAILS_BYTES = 8_000_000
#: ... and above this once compressed (Temporal refuses payloads over 2 MB).
MAX_PACKED_BYTES = 1_500_000
#: Delivered events remembered per shard: a lease renewal that crossed its event in flight does not re-add it.
_DELIVERED_MEMORY = 4096
_DETAILS_VERSION = 1


def compact_progress(progress: ProgressState, ring: int = DETAILS_RING) -> ProgressState:
    """``progress`` with every rank's rings cut to their last ``ring`` values (the totals and clocks kept)."""
    ranks = tuple(
        r.model_copy(
            update={
                "gaps_s": r.gaps_s[-ring:],
                "step_times_s": r.step_times_s[-ring:],
                "compute_times_s": r.compute_times_s[-ring:],
            }
        )
        for r in progress.ranks
    )
    return progress.model_copy(update={"ranks": ranks})


@dataclass
class Member:
    """One subscribed job: its subscription, its watch, and an event not delivered yet."""

    sub: WatchSubscription
    watcher: JobWatcher
    renewed_at: datetime
    pending: WatchEvent | None = None


class ShardHub:
    """The members of one watch shard (see the module docstring)."""

    def __init__(self, shard: int, logs: LogPolicy, lease_s: float, full_poll_every_s: float = 0.0) -> None:
        """``full_poll_every_s``: each member reads its lines in full this often, quiet polls between
        (``activities.logs.peek``); 0: every poll is a full one."""
        self.shard = shard
        self._full_every_s = full_poll_every_s
        self.members: dict[str, Member] = {}
        self._logs = logs
        self._lease = timedelta(seconds=lease_s)
        self._delivered: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self.changed = False
        """Membership changed since the last ``details``: a new member must reach the heartbeat soon."""
        self.view = ShardView(shard)
        """The shard's jobs and nodes as the shared scheduler feed says (unused with ``watch.scheduler_feed =
        local``); not heartbeated: a hub taken over reads the scheduler itself until the feed's next digest."""

    # ----- membership ------------------------------------------------------------------------------------------
    def subscribe(self, sub: WatchSubscription, now: datetime | None = None) -> str:
        """Add, renew or replace the subscriber's member; says which (``added``, ``renewed``, ``replaced``,
        ``stale``: an older subscription than the member's, or one whose event was already delivered)."""
        now = now or datetime.now(UTC)
        if self._delivered.get(sub.workflow_id) == (sub.run_id, sub.seq):
            return "stale"
        current = self.members.get(sub.workflow_id)
        if current is not None and current.sub.run_id == sub.run_id:
            if sub.seq == current.sub.seq:
                current.renewed_at = now
                return "renewed"
            if sub.seq < current.sub.seq:
                return "stale"
        state = WatchState(offsets=dict(sub.watch.offsets), progress=sub.watch.progress)
        watcher = JobWatcher(sub.watch, self._logs, state, started=now, full_poll_every_s=self._full_every_s)
        self.members[sub.workflow_id] = Member(sub, watcher, now)
        self.changed = True
        return "added" if current is None else "replaced"

    def unsubscribe(self, req: WatchUnsubscribe) -> bool:
        """Drop the subscriber's member if it is this run's, at ``seq`` or before; True when one was dropped."""
        current = self.members.get(req.workflow_id)
        if current is None or current.sub.run_id != req.run_id or current.sub.seq > req.seq:
            return False
        del self.members[req.workflow_id]
        self.changed = True
        return True

    def expire(self, now: datetime) -> list[str]:
        """Drop members not renewed for two leases (their workflow ended without unsubscribing); their ids."""
        gone = [k for k, m in self.members.items() if now - m.renewed_at > 2 * self._lease and m.pending is None]
        for key in gone:
            del self.members[key]
        self.changed = self.changed or bool(gone)
        return gone

    def delivered(self, key: str) -> None:
        """The member's event reached its workflow: the member leaves."""
        member = self.members.pop(key, None)
        if member is not None:
            self.changed = True
            self._delivered[key] = (member.sub.run_id, member.sub.seq)
            self._delivered.move_to_end(key)
            while len(self._delivered) > _DELIVERED_MEMORY:
                self._delivered.popitem(last=False)

    # ----- the activities served on the shard's own task queue ------------------------------------------------
    @activity.defn(name="watch_subscribe")
    async def subscribe_activity(self, sub: WatchSubscription) -> str:
        """A JobRecovery subscribes (or renews) its job with whichever process runs this shard now."""
        return self.subscribe(sub)

    @activity.defn(name="watch_unsubscribe")
    async def unsubscribe_activity(self, req: WatchUnsubscribe) -> bool:
        """A JobRecovery stops its job's watch (a GPU fault or a pause took over)."""
        return self.unsubscribe(req)

    @activity.defn(name=WATCH_FEED_APPLY_ACTIVITY)
    async def feed_apply_activity(self, batch: list[FeedUpdate]) -> int:
        """The shared scheduler feed's updates for this shard, in order (its ``ShardFeed`` mailbox sends them)."""
        self.view.apply(batch)
        return self.view.applied

    # ----- polling ---------------------------------------------------------------------------------------------
    def read_all(
        self, snap: ClusterSnapshot | Mapping[str, ClusterSnapshot], now: datetime | None = None
    ) -> list[tuple[str, PollStep]]:
        """Read every member without a pending event once against ``snap`` (blocking file I/O: one thread hop
        per shard poll). A member whose read fails is skipped this poll and logged, never dropped. With the shared
        feed ``snap`` is one small snapshot per member (its job and nodes); a member without one waits.

        Without ``now`` (production) each member is stamped when its own lines have been read: a time taken at the
        poll's start, before the snapshot wait and the other members' reads, dated detections up to 4.5 s before
        the line that caused them (the scale bench at 1,000 jobs: its crashes scored as false incidents)."""
        steps = []
        for key, member in list(self.members.items()):
            own = snap.get(key) if isinstance(snap, Mapping) else snap
            if member.pending is not None or own is None:
                continue
            try:
                steps.append((key, member.watcher.read(own, now)))
            except Exception:  # one job's unreadable state must not stop the shard's other jobs
                log.exception("shard %s: polling job %s failed", self.shard, member.sub.watch.job_id)
        return steps

    def settle(self, key: str, step: PollStep, fresh: ClusterSnapshot | None) -> JobWatchResult | None:
        """Finish the member's poll; a result becomes its pending event."""
        member = self.members.get(key)
        if member is None:  # unsubscribed while its read ran
            return None
        result = member.watcher.settle(step, fresh)
        if result is not None:
            member.pending = WatchEvent(run_id=member.sub.run_id, seq=member.sub.seq, shard=self.shard, result=result)
        return result

    def pending(self) -> list[tuple[str, Member]]:
        return [(k, m) for k, m in self.members.items() if m.pending is not None]

    # ----- durable state ---------------------------------------------------------------------------------------
    def details(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The shard's members as heartbeat details, bounded (module docstring): at most ``MAX_DETAILS_BYTES`` of
        JSON, and at most ``MAX_PACKED_BYTES`` once compressed."""
        self.changed = False
        entries = {key: _member_entry(m) for key, m in self.members.items()}
        texts = {key: _json(e) for key, e in entries.items()}  # each member serialised once
        kept = self._fit(entries, texts, MAX_DETAILS_BYTES)
        packed = _pack(kept, texts)
        if len(packed) > MAX_PACKED_BYTES:  # compressed worse than JSON ever does: cut to the ratio seen
            budget = int(sum(len(texts[k]) for k in kept) * MAX_PACKED_BYTES / len(packed) * 0.9)
            kept = self._fit(entries, texts, budget)
            packed = _pack(kept, texts)
        return {"v": _DETAILS_VERSION, **(extra or {}), "members": len(kept), "packed": packed}

    def _fit(self, entries: dict[str, Any], texts: dict[str, str], budget: int) -> list[str]:
        """The members kept within ``budget`` bytes of JSON (``texts`` updated): the largest members' progress left
        out first, then members (logged: the shard holds too many jobs)."""
        total = sum(len(texts[k]) for k in entries)
        for key in sorted(entries, key=lambda k: len(texts[k]), reverse=True):
            if total <= budget:
                return list(entries)
            watch = entries[key]["sub"]["watch"]
            if "progress" in watch:
                before = len(texts[key])
                del watch["progress"]
                texts[key] = _json(entries[key])
                total -= before - len(texts[key])
        if total <= budget:
            return list(entries)
        kept: list[str] = []
        running = 0
        for key in entries:
            if running + len(texts[key]) <= budget:
                kept.append(key)
                running += len(texts[key])
        log.error(
            "shard %s: %d of %d members left out of the heartbeat (over %d bytes): raise watch.shards",
            self.shard,
            len(entries) - len(kept),
            len(entries),
            budget,
        )
        return kept

    @classmethod
    def restore(
        cls,
        last: object,
        shard: int,
        logs: LogPolicy,
        lease_s: float,
        now: datetime,
        *,
        full_poll_every_s: float = 0.0,
    ) -> ShardHub:
        """The hub a previous attempt heartbeated (``details``), or an empty one; a member that does not read back
        (an older worker's shape) is left out: its JobRecovery's lease renewal brings it back."""
        hub = cls(shard, logs, lease_s, full_poll_every_s)
        if not isinstance(last, dict) or last.get("v") != _DETAILS_VERSION or not isinstance(last.get("packed"), str):
            return hub
        try:
            members = json.loads(zlib.decompress(base64.b64decode(last["packed"])))
        except (ValueError, zlib.error):
            log.error("shard %s: heartbeat details unreadable: starting empty (lease renewals bring jobs back)", shard)
            return hub
        for key, entry in members.items() if isinstance(members, dict) else ():
            with contextlib.suppress(ValidationError, ValueError, TypeError, KeyError):
                sub = WatchSubscription.model_validate(entry["sub"])
                state = WatchState(
                    offsets=dict(sub.watch.offsets),
                    polls=int(entry.get("polls", 0)),
                    nodes=[str(n) for n in entry.get("nodes", [])],
                    progress=sub.watch.progress,
                )
                started = datetime.fromisoformat(entry["started"])
                pending = WatchEvent.model_validate(entry["pending"]) if "pending" in entry else None
                watcher = JobWatcher(sub.watch, logs, state, started=started, full_poll_every_s=full_poll_every_s)
                hub.members[str(key)] = Member(sub, watcher, now, pending)
        return hub


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _pack(keys: list[str], texts: dict[str, str]) -> str:
    """The kept members as one compressed JSON object, joined from their serialised texts."""
    body = "{" + ",".join(f"{_json(k)}:{texts[k]}" for k in keys) + "}"
    return base64.b64encode(zlib.compress(body.encode(), 1)).decode()


def _member_entry(member: Member) -> dict[str, Any]:
    """One member as it is heartbeated: its subscription with the hub's current offsets and compacted progress."""
    state = member.watcher.state
    progress = compact_progress(state.progress) if state.progress is not None else None
    sub = member.sub.model_copy(
        update={"watch": member.sub.watch.model_copy(update={"offsets": state.offsets, "progress": progress})}
    )
    entry: dict[str, Any] = {
        "sub": sub.model_dump(mode="json", exclude_defaults=True),
        "polls": state.polls,
        "nodes": state.nodes,
        "started": member.watcher.started.isoformat(),
    }
    if member.pending is not None:
        # Its offsets are past the lines that made the event: the event itself must survive a takeover.
        entry["pending"] = member.pending.model_dump(mode="json")
    return entry
