"""The RL loop: rollouts, the update, the trainer, workdirs, checkpoints, sharding, progress, SFT."""

# The submodules (``from jtc.rl import *`` imports them).
__all__ = [
    'batch',
    'checkpoints',
    'config_check',
    'distributed',
    'evaluation',
    'ledger_recorder',
    'loop',
    'population',
    'rendezvous',
    'rollout',
    'sft',
    'sharding',
    'trainer',
    'update',
    'workdir',
]
