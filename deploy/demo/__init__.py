"""The lab's demo training job and its fault injection (the user's side: nothing of Rebound's runtime).

``train`` is the torch.distributed job srun launches, ``checkpoint`` its atomic checkpoints, ``faults`` the hooks
through which a rank breaks itself on request, ``inject`` the injector (records every fault's true onset),
``submit`` and ``train.sbatch`` put the job on the lab's Slurm.
"""
