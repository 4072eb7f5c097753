r"""Cost of `jtc.analysis.diagnostics.step_diagnostics` relative to an ordinary update step.

  python benchmarks/diagnostics.py                      # tiny policy, B = 8 groups x 8, T = 32
  python benchmarks/diagnostics.py --model small_25m    # the 25M benchmark model
  python benchmarks/diagnostics.py --small              # a quick check (B = 2 x 4, T = 16)

Times (median of --repeats, after compilation) one jitted `jtc.rl.update.update_step` (forward,
backward, AdamW) and one jitted `step_diagnostics` on the same mini-batch, then prints the
amortised slow-down of logging diagnostics every `--every` update steps (default 10, the
`diagnostics_every` of configs/common.py):  (every * t_update + t_diag) / (every * t_update).
Target: <= 1.10x. In the trainer the diagnostics run once per RL step (which also samples and
scores), so this per-update-step ratio is an upper bound.
"""

import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import harness  # noqa: E402  (first: --cpu acts before jax is imported)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from jtc.analysis import diagnostics  # noqa: E402
from jtc.analysis import grad_norms  # noqa: E402
from jtc.models import model as model_lib  # noqa: E402
from jtc.models import logprobs
from jtc.rl import update as update_lib  # noqa: E402
from benchmarks.machine import median_time  # noqa: E402  (the shared timer)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--model', default='tiny', choices=['tiny', 'small_25m'])
  ap.add_argument('--groups', type=int, default=8, help='groups per update mini-batch')
  ap.add_argument('--group_size', type=int, default=8)
  ap.add_argument('--prompt_width', type=int, default=20)
  ap.add_argument('--max_new_tokens', type=int, default=32)
  ap.add_argument('--loss', default='gspo')
  ap.add_argument('--mode', default='proxy', choices=sorted(grad_norms.GRAD_NORM_MODES))
  ap.add_argument('--every', type=int, default=10)
  ap.add_argument('--repeats', type=int, default=5)
  ap.add_argument('--small', action='store_true', help='tiny shapes for a quick check')
  harness.add_cpu_flag(ap)
  a = ap.parse_args()
  print(f'# {harness.device_line()}')
  if a.small:
    a.groups, a.group_size, a.max_new_tokens, a.repeats = 2, 4, 16, 3

  config = (model_lib.ModelConfig.tiny(
      vocab_size=98) if a.model == 'tiny' else model_lib.ModelConfig.small_25m())
  G, P, T = a.group_size, a.prompt_width, a.max_new_tokens
  B = a.groups * G
  rng = np.random.default_rng(0)
  params = model_lib.init_params(config, jax.random.key(0))
  prompts = np.repeat(rng.integers(3, config.vocab_size, size=(a.groups, P)), G, axis=0)
  comp = rng.integers(3, config.vocab_size, size=(B, T))
  comp[:, :8] = comp[:1, :8]  # a shared template prefix
  lengths = rng.integers(T // 2, T + 1, size=B)
  mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
  tokens = jnp.asarray(np.concatenate([prompts, comp], 1), jnp.int32)
  input_mask = jnp.asarray(np.concatenate([np.ones((B, P)), mask], 1), jnp.int32)
  old = logprobs.sequence_logprobs(params, config, tokens, input_mask, completion_start=P)
  batch = update_lib.Batch(
      tokens_BL=tokens, input_mask_BL=input_mask, mask_BT=jnp.asarray(mask),
      advantages_B=jnp.asarray(rng.normal(size=B), jnp.float32),
      old_logps_BT=old['logps'] + 0.01 * jnp.asarray(rng.normal(size=(B, T)), jnp.float32))

  optimizer = optax.adamw(1e-6)
  update = jax.jit(
      functools.partial(update_lib.update_step, model_config=config, optimizer=optimizer,
                        loss_name=a.loss, loss_hparams={}, completion_start=P, group_size=G))
  diag = jax.jit(
      functools.partial(diagnostics.step_diagnostics, model_config=config, loss_name=a.loss,
                        loss_hparams={}, group_size=G, completion_start=P, mode=a.mode))
  state = update_lib.TrainState(step=jnp.array(0, jnp.int32), params=params,
                                opt_state=optimizer.init(params))
  update_batch = jax.tree.map(lambda x: x[None], batch)  # one micro-batch: [n=1, B, ...]
  jax.block_until_ready(update(state, update_batch))
  jax.block_until_ready(diag(params, batch=batch))
  t_update = median_time(lambda: update(state, update_batch)[1], a.repeats)
  t_diag = median_time(lambda: diag(params, batch=batch), a.repeats)
  ratio = (a.every * t_update + t_diag) / (a.every * t_update)
  print(f'model={a.model} params={model_lib.num_params(params):,} B={B} (G={G}) P={P} T={T} '
        f'loss={a.loss} mode={a.mode}')
  print(f'{"update step":>28s} {"step_diagnostics":>18s} {"diag/update":>12s} '
        f'{"amortised every " + str(a.every):>20s}')
  print(f'{t_update * 1e3:25.1f} ms {t_diag * 1e3:15.1f} ms {t_diag / t_update:12.2f} '
        f'{ratio:19.3f}x   (target <= 1.10x: {"OK" if ratio <= 1.10 else "MISSED"})')


if __name__ == '__main__':
  main()
