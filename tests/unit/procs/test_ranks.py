"""Choosing one process per rank when launchers, wrappers and helpers share a rank's environment."""

from __future__ import annotations

from activities.procs.proc import JobProcess, ProcStat
from activities.procs.ranks import choose_ranks, runs_node_launcher

TRAIN = ("/venv/bin/python", "-m", "deploy.demo.train")


def proc(
    pid: int,
    rank: int,
    *,
    ppid: int = 1,
    comm: str = "python",
    source: str = "SLURM_PROCID",
    step: str = "0",
    argv: tuple[str, ...] = TRAIN,
    exe: str = "/usr/bin/python3.11",
) -> JobProcess:
    stat = ProcStat(pid, comm, "S", ppid, 0, 0, 1, 0, 0)
    return JobProcess(stat, rank, source, None, step, argv, exe, "")


def chosen(*procs: JobProcess) -> list[tuple[int, int]]:
    return [(p.rank, p.pid) for p in choose_ranks(procs)[0]]


def test_one_process_per_rank_is_kept_as_is() -> None:
    assert chosen(proc(11, 1), proc(10, 0), proc(12, 2)) == [(0, 10), (1, 11), (2, 12)]


def test_batch_script_and_srun_lose_to_the_python_rank() -> None:
    # First node of an sbatch job: bash (batch step) -> srun, and rank 0 under slurmstepd; all SLURM_PROCID=0.
    batch = proc(5, 0, comm="bash", step="", argv=("/bin/bash", "/var/spool/slurmd/job1/slurm_script"), exe="/bin/bash")
    srun = proc(6, 0, ppid=5, comm="srun", step="", argv=("srun", "python"), exe="/usr/bin/srun")
    rank0 = proc(20, 0, ppid=19)
    rank1 = proc(21, 1, ppid=19)
    procs, notes = choose_ranks([batch, srun, rank0, rank1])
    assert [(p.rank, p.pid) for p in procs] == [(0, 20), (1, 21)]
    assert any(n.startswith("pid 5 (bash): also claims rank 0; chose pid 20") for n in notes)
    assert not any("pid 6" in n for n in notes)  # srun is never a candidate at all


def test_wrapper_shell_loses_to_its_python_child_even_when_not_a_leaf_itself() -> None:
    wrapper = proc(30, 2, comm="bash", argv=("bash", "-c", "python train.py; echo done"), exe="/bin/bash")
    child = proc(31, 2, ppid=30)
    assert chosen(wrapper, child) == [(2, 31)]


def test_python_launcher_loses_to_its_python_leaf() -> None:
    launcher = proc(40, 3, argv=("python", "launch.py"))
    leaf = proc(41, 3, ppid=40, argv=("python", "train.py"))
    assert chosen(launcher, leaf) == [(3, 41)]


def test_torchrun_workers_with_rank_replace_the_launcher() -> None:
    # srun starts one torchrun per node (SLURM_PROCID = node index); torchrun starts RANK workers.
    torchrun = proc(50, 1, argv=("/venv/bin/python", "/venv/bin/torchrun", "train.py"))
    batch = proc(49, 0, comm="bash", step="", exe="/bin/bash", argv=("bash", "script"))
    workers = [proc(51 + i, 8 + i, ppid=50, source="RANK") for i in range(4)]
    procs, notes = choose_ranks([batch, torchrun, *workers])
    assert [(p.rank, p.pid) for p in procs] == [(8, 51), (9, 52), (10, 53), (11, 54)]
    assert sum("launcher of RANK workers" in n for n in notes) == 1  # the batch script
    assert any(n.startswith("pid 50 (python): per-node launcher (SLURM_PROCID=1)") for n in notes)


def test_a_launcher_whose_workers_have_not_started_is_not_a_rank() -> None:
    """The lab's torchrun job asked 5 s after its start: torchrun was still in its rendezvous, the map read its
    two agents as srun ranks 0@n1 1@n2, and never looked again."""
    torchrun = proc(50, 1, argv=("/venv/bin/python", "/venv/bin/torchrun", "--nnodes=2", "train.py"))
    procs, notes = choose_ranks([torchrun])
    assert procs == [] and any("per-node launcher" in n for n in notes)


def test_per_node_launchers_are_known_by_their_first_arguments() -> None:
    for argv in [
        ("/venv/bin/torchrun", "--nproc-per-node=4", "train.py"),
        ("python", "-m", "torch.distributed.run", "train.py"),
        ("python3", "-m", "torch.distributed.launch", "train.py"),
        ("/venv/bin/python", "/venv/bin/accelerate", "launch", "train.py"),
        ("python", "-m", "accelerate.commands.launch", "train.py"),
        ("python", "-m", "deepspeed.launcher.launch", "--world_info=e30=", "train.py"),
    ]:
        assert runs_node_launcher(argv), argv
    for argv in [
        ("python", "train.py"),
        ("python", "-m", "deploy.demo.train"),
        ("python", "train.py", "--notes", "torchrun"),  # a word later on the line is an argument, not the program
        ("/venv/bin/accelerate", "env"),
    ]:
        assert not runs_node_launcher(argv), argv


def test_forked_and_multiprocessing_helpers_are_not_ranks() -> None:
    rank = proc(60, 0)
    forked_loader = proc(61, 0, ppid=60)  # fork start method: the same argv
    spawned = proc(62, 0, ppid=60, argv=("python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"))
    tracker = proc(63, 0, ppid=60, argv=("python", "-c", "from multiprocessing.resource_tracker import main;main(6)"))
    compile_worker = proc(64, 0, ppid=60, argv=("python", "-m", "torch._inductor.compile_worker"))
    grandchild = proc(65, 0, ppid=61)  # a helper of a helper
    procs, notes = choose_ranks([rank, forked_loader, spawned, tracker, compile_worker, grandchild])
    assert [(p.rank, p.pid) for p in procs] == [(0, 60)]
    assert len([n for n in notes if "helper of rank 0" in n]) == 5


def test_two_unrelated_claims_prefer_the_newest_step_then_lowest_pid() -> None:
    assert chosen(proc(70, 0, step="0"), proc(71, 0, step="1")) == [(0, 71)]
    assert chosen(proc(81, 0, step="0"), proc(80, 0, step="0")) == [(0, 80)]
    assert chosen(proc(90, 0, step="batch"), proc(91, 0, step="0")) == [(0, 91)]


def test_only_non_python_processes_still_give_a_rank() -> None:
    # A compiled rank: py-spy will say it is not Python, but the process is still listed.
    assert chosen(proc(100, 0, comm="a.out", exe="/opt/a.out", argv=("/opt/a.out",))) == [(0, 100)]


def test_parent_cycle_does_not_hang() -> None:
    a = proc(110, 0, ppid=111, argv=("python", "a.py"))
    b = proc(111, 0, ppid=110, argv=("python", "b.py"))
    assert len(chosen(a, b)) == 1
