"""The RL loop: rollouts, the update, the trainer, workdirs, checkpoints, sharding, progress, SFT; a run's export and a checkpoint's evaluation."""

# The submodules (``from jtc.rl import *`` imports them).
__all__ = [
    'batch',
    'checkpoint_eval',
    'checkpoints',
    'config_check',
    'decoding',
    'distributed',
    'evaluation',
    'export',
    'ledger_recorder',
    'minibatch_order',
    'partial',
    'population',
    'preflight',
    'progress',
    'rendezvous',
    'rollout',
    'routing',
    'sft_trainer',
    'sharding',
    'stages',
    'step',
    'trainer',
    'update',
    'workdir',
]
