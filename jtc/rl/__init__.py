"""The RL loop: rollouts, the update, the trainer, workdirs, checkpoints, sharding, the command line, SFT."""
