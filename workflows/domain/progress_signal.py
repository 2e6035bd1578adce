"""The signs that a job trains besides its step lines (``ProgressSignal``); ``workflows.domain.progress`` exports
it with the progress state."""

from enum import StrEnum

__all__ = ["ProgressSignal"]


class ProgressSignal(StrEnum):
    """A sign that a job trains, besides the per-rank step lines the watch folds into ``ProgressState``.

    A job that prints no step line (Lightning under Slurm without a TTY prints no bar) still shows these; the
    resume check names the one that decided, and a restarted job that fails again is said to have "failed before
    it trained" only when none of them showed.
    """

    STEP_LINE = "step_line"
    """A training step line of the restarted attempt."""
    CHECKPOINT = "checkpoint"
    """A new complete checkpoint in the job's ``ckpt=`` directory, saved after the restart (it trained to save it)."""
    STACKS = "stacks"
    """The ranks' stacks sampled by the node agents moved between samples (not all parked in one collective)."""
    HEARTBEAT = "heartbeat"
    """A heartbeat file touched after the restart: alive, not proof of a trained step."""
    CHECKPOINT_LOAD = "checkpoint_load"
    """The framework's own line saying which checkpoint it loaded: started, not proof of a trained step."""

    @property
    def proves_training(self) -> bool:
        """Whether this signal alone means the job trains again (a heartbeat or a load line only says it lives)."""
        return self in (ProgressSignal.STEP_LINE, ProgressSignal.CHECKPOINT, ProgressSignal.STACKS)
