"""The job table engine: every rule of the job contract (``docs/contract.md``), no I/O.

No module here imports a network, event-loop or clock library (TIM-2; a test enforces
it).
Time enters through the injected ``clock`` and randomness through ``rng``; the engine
tells its driver when it next needs attention (``JobTable.next_event_at()``).

Exceptions::

    ValueError
     └── InvalidArgument   a bad argument; .field names it; nothing changed
          ├── PayloadTooLarge   the encoded payload is over max_payload_bytes
          └── DependencyCycle   the jobs of a group depend on each other in a circle
"""

from ._errors import DependencyCycle, InvalidArgument, PayloadTooLarge
from ._guards import MAX_AFTER
from ._guards import queue_name as check_queue_name
from ._schedule import (
    MISSED_GRACE_S,
    MISSED_POLICIES,
    ScheduleInfo,
    ScheduleSpec,
    check_timing,
    fire,
    next_tick,
    same_timing,
    tick_key,
)
from ._schedules import SCHEDULE_FIELDS
from ._table import (
    CLAIM_FIELDS,
    DEP_FIELDS,
    LIST_STATES,
    MAX_PROGRESS_BYTES,
    QUEUE_FIELDS,
    ROW_FIELDS,
    SEARCH_SCAN,
    UPDATE_FIELDS,
    Changes,
    Finish,
    JobHandle,
    JobTable,
    Queue,
    Step,
    check_list_key,
    lease_number,
)
from ._types import (
    LIMIT_FIELDS,
    Job,
    JobState,
    Limits,
    NewJob,
    QueueOpts,
    QueueStats,
    QueueTotals,
    RawJSON,
    SweepResult,
)

__all__ = [
    "CLAIM_FIELDS",
    "DEP_FIELDS",
    "LIMIT_FIELDS",
    "LIST_STATES",
    "MAX_AFTER",
    "MAX_PROGRESS_BYTES",
    "MISSED_GRACE_S",
    "MISSED_POLICIES",
    "QUEUE_FIELDS",
    "ROW_FIELDS",
    "SCHEDULE_FIELDS",
    "SEARCH_SCAN",
    "UPDATE_FIELDS",
    "Changes",
    "DependencyCycle",
    "Finish",
    "InvalidArgument",
    "Job",
    "JobHandle",
    "JobState",
    "JobTable",
    "Limits",
    "NewJob",
    "PayloadTooLarge",
    "Queue",
    "QueueOpts",
    "QueueStats",
    "QueueTotals",
    "RawJSON",
    "ScheduleInfo",
    "ScheduleSpec",
    "Step",
    "SweepResult",
    "check_list_key",
    "check_queue_name",
    "check_timing",
    "fire",
    "lease_number",
    "next_tick",
    "same_timing",
    "tick_key",
]
