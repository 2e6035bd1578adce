"""``rebound lab ...``: bring the local stack up and down, submit the demo job, inject faults.

Plugs into the ``rebound`` CLI through the ``rebound.cli`` entry point ``lab`` (``workers.cli_plugins``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from deploy.local.config import LabConfig
from deploy.local.lab import Lab, format_status
from deploy.local.processes import LabError
from workers.cli_plugins import Commands


def register(commands: Commands) -> None:
    """Add ``rebound lab LAB_COMMAND ...``."""
    lab = commands.command(
        "lab", run_lab_command, help="the local lab: Temporal dev server, Slurm cluster with fake GPUs, agents"
    )
    lab.add_argument("--state-dir", type=Path, help="lab state directory (default ./.rebound-lab)")
    cmds = lab.add_subparsers(dest="lab_command", required=True, metavar="LAB_COMMAND")
    cmds.add_parser("up", help="start everything that is not running (idempotent)")
    cmds.add_parser("demo", help="up, then submit and monitor the demo training job and show it training")
    down = cmds.add_parser("down", help="stop what `up` started (state is kept)")
    down.add_argument("--keep-jobs", action="store_true", help="do not cancel the lab's Slurm jobs")
    st = cmds.add_parser("status", help="what runs, node states, where the UI is")
    st.add_argument("--json", action="store_true")
    cmds.add_parser("token", help="print a Slurm JWT for slurmrestd over TCP")
    cmds.add_parser("env", help='print shell exports for this lab (eval "$(rebound lab env)")')

    demo = cmds.add_parser("submit-demo", help="submit the demo torch.distributed training job")
    demo.add_argument("--run", default=None, help="run name (default demo-<timestamp>)")
    demo.add_argument("--nodes", type=int, default=2)
    demo.add_argument("--tasks-per-node", type=int, default=2)
    demo.add_argument("--steps", type=int, default=100000)
    demo.add_argument("--checkpoint-every", type=int, default=20)
    demo.add_argument(
        "--trainer",
        choices=["demo", "lightning", "hf"],
        default="demo",
        help="the demo loop, or a real PyTorch Lightning / Hugging Face Trainer job (needs the trainers extra)",
    )
    demo.add_argument(
        "--launcher",
        choices=["srun", "torchrun"],
        default="srun",
        help="srun: one task per rank, a log per rank; torchrun: torchrun under srun, one slurm-%%j.out",
    )

    inj = cmds.add_parser("inject", help="break a demo run for real (records the fault's true onset time)")
    inj.add_argument(
        "kind",
        choices=[
            "crash",
            "segv",
            "kill",
            "hang",
            "slow",
            "gpu-fault",
            "xid",
            "user-bug",
            "node-crash",
            "kernel",
            "recovery-action",
            "node-check",
            "nhc",
        ],
    )
    inj.add_argument("--run", help="demo run name (every kind but node-crash)")
    inj.add_argument("--rank", default="0", help="target rank (user-bug also takes 'all')")
    inj.add_argument("--node", help="target node (node-crash)")
    inj.add_argument("--delay", type=float, default=1.0, help="slow: extra seconds per step")
    inj.add_argument("--xid", type=int, default=79, help="gpu-fault, xid: the XID to raise")
    inj.add_argument("--gpu", type=int, default=None, help="gpu-fault: GPU index (default: the rank's GPU)")
    inj.add_argument("--line", help="kernel: the kernel line to write into --node's kernel log, as is")
    inj.add_argument("--sxid", type=int, default=None, help="kernel: write an NVSwitch SXid line with this number")
    inj.add_argument("--fatal", action="store_true", help="kernel --sxid: the line says Fatal (else Non-fatal)")
    inj.add_argument(
        "--action",
        default="node_reboot",
        help="recovery-action: what NVML reports for --node's --gpu (none, gpu_reset, node_reboot, drain_p2p, "
        "drain_and_reset, ... or a number)",
    )
    inj.add_argument(
        "--mode",
        choices=["hang", "exit", "off"],
        default="hang",
        help="node-check: --node's next check job fails (its last rank hangs or exits before the all-reduce; off: "
        "passes again); nhc: off stops the lab's HealthCheckProgram draining --node (its drain stays)",
    )
    inj.add_argument(
        "--frozen",
        action="store_true",
        help="node-crash: freeze the node's job steps instead of killing them (peers hang as with a real dead host)",
    )


def lab_config(args: argparse.Namespace) -> LabConfig:
    overrides: dict[str, Any] = {}
    if args.state_dir is not None:
        overrides["state_dir"] = args.state_dir
    return LabConfig(**overrides)


def run_lab_command(args: argparse.Namespace) -> int:
    """Dispatch ``rebound lab <command>``; lab errors become a message and exit code 1."""
    from deploy.demo.inject import InjectionError
    from deploy.demo.submit import SubmitError

    try:
        lab = Lab(lab_config(args))
        return _dispatch(lab, args)
    except (LabError, InjectionError, SubmitError, ValueError) as e:
        print(f"rebound lab: {e}", file=sys.stderr)
        return 1


def _dispatch(lab: Lab, args: argparse.Namespace) -> int:
    cmd = args.lab_command
    if cmd == "up":
        took = lab.up()
        print(format_status(lab.status()))
        print(f"lab is up ({took:.1f} s). Use it from a shell with: source {lab.cfg.layout.env_file}")
        return 0
    if cmd == "demo":
        from deploy.local.demo_cmd import run_demo

        return run_demo(lab)
    if cmd == "down":
        lab.down(keep_jobs=args.keep_jobs)
        print("lab is down (state kept in", lab.cfg.state_dir, ")")
        return 0
    if cmd == "status":
        st = lab.status()
        if args.json:
            print(json.dumps(st.model_dump(), indent=2))
        else:
            print(format_status(st))
        return 0 if st.all_running else 1
    if cmd == "token":
        print(lab.slurm.token())
        return 0
    if cmd == "env":
        lab.write_env_file()
        print(lab.cfg.layout.env_file.read_text(), end="")
        return 0
    if cmd == "submit-demo":
        from deploy.demo.submit import submit_demo

        run = args.run or time.strftime("demo-%Y%m%d-%H%M%S")
        job_id = submit_demo(
            lab.cfg.layout,
            run,
            nodes=args.nodes,
            tasks_per_node=args.tasks_per_node,
            steps=args.steps,
            checkpoint_every=args.checkpoint_every,
            env=lab.slurm.env(),
            trainer=args.trainer,
            launcher=args.launcher,
        )
        print(json.dumps({"run": run, "job_id": job_id, "run_dir": str(lab.cfg.layout.run_dir(run))}))
        return 0
    if cmd == "inject":
        return _inject(lab, args)
    raise AssertionError(cmd)


def _inject(lab: Lab, args: argparse.Namespace) -> int:
    from deploy.demo import inject

    if args.kind == "kernel":
        return _inject_kernel(lab, args)
    if args.kind == "recovery-action":
        return _inject_recovery_action(lab, args)
    if args.kind in ("node-check", "nhc"):
        return _inject_node_check(lab, args)

    record = inject.inject(
        lab.cfg.layout,
        kind=args.kind,
        run=args.run,
        rank=args.rank,
        node=args.node,
        delay_s=args.delay,
        xid=args.xid,
        gpu=args.gpu,
        frozen_tasks=args.frozen,
    )
    print(record.model_dump_json())
    return 0


def _inject_kernel(lab: Lab, args: argparse.Namespace) -> int:
    """A kernel line into a node's file-backed kernel log: --line as is, --sxid an NVSwitch line, else an NVRM XID
    line (--xid, --gpu) naming the GPU by the PCI bus id its fake NVML reports."""
    from deploy.local.kernel_log import append_kernel_line, sxid_line, xid_line

    if not args.node:
        raise SystemExit("inject kernel: --node is required")
    if args.line:
        line = args.line
    elif args.sxid is not None:
        line = sxid_line(args.sxid, fatal=args.fatal)
    else:
        line = xid_line(args.node, args.gpu if args.gpu is not None else 0, args.xid)
    t0 = datetime.now(UTC)
    append_kernel_line(lab.cfg.layout.kernel_log(args.node), line)
    print(json.dumps({"kind": "kernel", "node": args.node, "line": line, "t0": t0.isoformat()}))
    return 0


def _inject_recovery_action(lab: Lab, args: argparse.Namespace) -> int:
    """Set the GPU recovery action --node's fake NVML reports for --gpu (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)."""
    from deploy.local.fake_nvml_state import set_recovery_action
    from workflows.domain.gpu import GpuRecoveryAction

    if not args.node:
        raise SystemExit("inject recovery-action: --node is required")
    names = [a.value for a in GpuRecoveryAction if a is not GpuRecoveryAction.UNKNOWN]
    if args.action.isdigit():
        code = int(args.action)
    elif args.action in names:
        code = names.index(args.action)  # pynvml's numbering: the enum lists its values in order
    else:
        raise SystemExit(f"inject recovery-action: --action is a number or one of {', '.join(names)}")
    gpu = args.gpu if args.gpu is not None else 0
    t0 = datetime.now(UTC)
    set_recovery_action(lab.cfg.layout.nvml_state(args.node), gpu, code)
    action = GpuRecoveryAction.from_code(code).value
    print(
        json.dumps(
            {
                "kind": "recovery-action",
                "node": args.node,
                "gpu": gpu,
                "code": code,
                "action": action,
                "t0": t0.isoformat(),
            }
        )
    )
    return 0


def _inject_node_check(lab: Lab, args: argparse.Namespace) -> int:
    """node-check: --node's check job fails in a way only the job sees; nhc: the lab's HealthCheckProgram drains
    --node as ``NHC: <--line>`` (deploy/local/node_check_lab.py)."""
    from deploy.local.node_check_lab import fail_check, fail_nhc

    if not args.node:
        raise SystemExit(f"inject {args.kind}: --node is required")
    off = args.mode == "off"
    if args.kind == "node-check":
        fail_check(lab.cfg.state_dir, args.node, None if off else args.mode)
    else:
        fail_nhc(lab.cfg.state_dir, args.node, None if off else (args.line or "lab: injected"))
    print(json.dumps({"kind": args.kind, "node": args.node, "mode": args.mode, "t0": datetime.now(UTC).isoformat()}))
    return 0
