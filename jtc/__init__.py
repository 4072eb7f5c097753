"""jtc: what an intra-group RL objective does to each token, in JAX.

Subpackages, by stage (README.md, "Layout"):
  jtc.objectives  advantages, in-group transforms, per-token surrogates, the loss, DelTA
  jtc.models      model config, decoder, decoding, sampler, Hugging Face import, tokenizers
  jtc.data        synthetic tasks, verifiers, prepared datasets, the grain pipeline
  jtc.rl          the RL step built once, rollouts, the update, the trainer, workdirs,
                  checkpoints, sharding, SFT
  jtc.analysis    step diagnostics, offline probes, curve statistics, metric files, plots,
                  the per-token ledger, experiment tracking
  jtc.plan        one RL step compiled for a TPU slice without the hardware; --suggest
  jtc.cli         the commands and the ``jtc`` dispatcher

Commands: ``jtc <command>`` or ``python -m jtc.<command>`` for train, sft, ledger, plot, data
and plan. The import paths of jtc 0.1 were retired in 0.2.0: CHANGELOG.md lists
each old path and name with its new home.
"""
