"""The demo jobs' rendezvous ports, derived from the job id and the attempt (torch-free, so the torchrun batch
script asks it before torch is imported: ``python -m deploy.demo.ports torchrun``).

Every range lies below the Linux ephemeral range (32768+) and clear of the lab's daemons (6817-6820, 7233/8233,
17001+ for slurmd). Each job id owns ``RESTART_SLOTS`` consecutive ports, one per attempt, so a requeued attempt
never meets a lingering process (or c10d store) of the previous one. Two labs on one host (make test's two test
labs) hand out the same job ids: each lab's jobs get their own half of every range, by ``PORT_SLOT_ENV`` (0 or 1:
``LabConfig.demo_port_slot``, which the lab's Slurm environment hands to every job submitted with it), so two jobs 12
never meet on a port.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple

__all__ = ["GLOO", "PORT_SLOT_ENV", "RESTART_SLOTS", "TORCHRUN", "PortRange", "port_slot", "rendezvous_port"]

RESTART_SLOTS: Final = 8
PORT_SLOT_ENV: Final = "REBOUND_DEMO_PORT_SLOT"


class PortRange(NamedTuple):
    """``base`` and the ``span`` of one port slot (the range is ``base`` .. ``base + 2 * span``)."""

    base: int
    span: int


#: The srun-per-rank demo, Lightning and HF jobs: gloo's rendezvous on loopback (20000-29999).
GLOO: Final = PortRange(20000, 5000)
#: torchrun's c10d rendezvous (30000-32699).
TORCHRUN: Final = PortRange(30000, 1350)


def rendezvous_port(job_id: int | None, restart: int, slot: int = 0, ports: PortRange = GLOO) -> int:
    """The TCP port of one attempt's rendezvous: distinct for consecutive attempts and consecutive jobs, and
    between the two port slots."""
    offset = ((job_id or 0) * RESTART_SLOTS + restart % RESTART_SLOTS) % ports.span
    return ports.base + slot * ports.span + offset


def port_slot(environ: Mapping[str, str]) -> int:
    """The lab's port slot from ``PORT_SLOT_ENV``: 0 unless set to 1."""
    return 1 if environ.get(PORT_SLOT_ENV, "0").strip() == "1" else 0


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    """``python -m deploy.demo.ports torchrun``: print this Slurm attempt's torchrun port (``SLURM_JOB_ID``,
    ``SLURM_RESTART_COUNT``, ``PORT_SLOT_ENV`` from the environment)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args != ["torchrun"] or not environ.get("SLURM_JOB_ID", "").isdigit():
        print("usage: SLURM_JOB_ID=N [SLURM_RESTART_COUNT=R] python -m deploy.demo.ports torchrun", file=sys.stderr)
        return 2
    restart = int(environ.get("SLURM_RESTART_COUNT") or 0)
    print(rendezvous_port(int(environ["SLURM_JOB_ID"]), restart, port_slot(environ), TORCHRUN))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
