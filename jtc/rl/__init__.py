"""The RL loop: rollouts, the update, the trainer, workdirs, checkpoints, sharding, progress, SFT."""

# The submodules (``from jtc.rl import *`` imports them).
__all__ = [
    'batch',
    'checkpoints',
    'config_check',
    'distributed',
    'evaluation',
    'ledger_recorder',
    'population',
    'preflight',
    'progress',
    'rendezvous',
    'rollout',
    'sft_trainer',
    'sharding',
    'stages',
    'step',
    'trainer',
    'update',
    'workdir',
]
