"""A kernel-log XID line carries what the driver said beyond the number, so the agent judges it as the job logs do:
an NVLink5 XID labelled Nonfatal and XID 154 back to None are evidence, not faults; Fatal and 154 to a reboot are."""

from __future__ import annotations

import pytest

from activities.gpu.xid_catalog import default_xid_catalog
from activities.kernel.lines import parse_line
from activities.kernel.sxid_catalog import default_sxid_catalog
from tests.unit.policy.test_xid_line import (
    FATAL_149,
    NONFATAL_145_B200,
    NONFATAL_149,
    XID154_BACK_TO_NONE,
    XID154_REBOOT,
)
from workflows.domain.gpu import GpuRecoveryAction
from workflows.policy.gpu_event_rules import is_gpu_fault

SXIDS = default_sxid_catalog()


@pytest.mark.parametrize(
    ("line", "fatal", "action", "fault"),
    [
        (NONFATAL_149, False, None, False),
        (NONFATAL_145_B200, False, None, False),
        (FATAL_149, True, None, True),
        (XID154_BACK_TO_NONE, None, GpuRecoveryAction.NONE, False),
        (XID154_REBOOT, None, GpuRecoveryAction.NODE_REBOOT, True),
    ],
)
def test_the_lines_words_travel_with_the_event(
    line: str, fatal: bool | None, action: GpuRecoveryAction | None, fault: bool
) -> None:
    event = parse_line(line, host="n1", sxids=SXIDS)
    assert event is not None
    assert (event.fatal, event.recovery_action) == (fatal, action)
    assert is_gpu_fault(event, default_xid_catalog()) is fault
