"""Tests of jtc.rl.ledger_recorder: the columns it records at the behaviour policy and before the
second update, and the ledger directory it writes, read back by `jtc.analysis.ledger.load`. The
trainer's run that writes ledgers end to end is tests/analysis/test_ledger.py's."""
import jax
import jax.numpy as jnp
import numpy as np

from configs import common
from jtc.analysis import ledger as ledger_lib
from jtc.models import logprobs
from jtc.models import model as model_lib
from jtc.models import tokenizer as tokenizer_lib
from jtc.rl import ledger_recorder
from jtc.rl import population
from jtc.rl import rollout
from jtc.rl import update

G, P, T = 2, 3, 4


def test_the_recorded_ledger_loads_with_its_points_rows_and_parameters(tmp_path):
  c = common.get_config('smoke')
  common.set_loss(c, 'gspo')
  c.rollout.sampling.num_samples, c.data.prompt_width = G, P
  tok = tokenizer_lib.from_spec({'kind': 'char'})
  mc = model_lib.ModelConfig.tiny(vocab_size=tok.vocab_size, n_layers=1, d_ff=64)
  params = model_lib.init_params(mc, jax.random.key(0))
  B = 2 * G
  tokens_BL = jax.random.randint(jax.random.key(1), (B, P + T), 3, tok.vocab_size)
  input_mask_BL = jnp.ones((B, P + T), jnp.int32)
  logps_BT = logprobs.sequence_logprobs(params, mc, tokens_BL, input_mask_BL,
                                        completion_start=P)['logps']
  batch = update.Batch(tokens_BL=tokens_BL, input_mask_BL=input_mask_BL, mask_BT=jnp.ones((B, T)),
                       advantages_B=jnp.array([1.0, -1.0, 0.5, -0.5]), old_logps_BT=logps_BT)
  recorder = ledger_recorder.LedgerRecorder(
      ledger_recorder.make_columns_fn(c, mc, population.SINGLE), batch, population.SINGLE)
  moved = jax.tree.map(lambda x: x + 0.05, params)  # the parameters before the second update
  recorder.before_update(0, params, np.arange(G))
  recorder.before_update(1, moved, np.arange(G, B))
  recorder.before_update(2, moved, np.arange(G))  # kept for replay; no third point
  ro = rollout.Rollout(tokens_BL=np.asarray(tokens_BL), input_mask_BL=np.asarray(input_mask_BL),
                       completion_BT=np.asarray(tokens_BL[:, P:]), completion_mask_BT=np.ones(
                           (B, T), np.int32), sampler_logps_BT=np.asarray(logps_BT) - 0.01,
                       truncated_B=np.zeros(B, bool), rewards_B=np.array([1, 0, 1, 0], np.float32),
                       texts=('a', 'b', 'c', 'd'))
  recorder.write(5, run_dirs=[str(tmp_path)], rollouts=[ro], tokenizer=tok, c=c, model_config=mc,
                 learning_rates=[1e-3])
  ledger = ledger_lib.load(str(tmp_path), 5)
  assert ledger.points == ledger_lib.POINTS and ledger.meta['loss'] == 'gspo'
  assert ledger.meta['updates'] == [[0, 1], [2, 3], [0, 1]]
  # The behaviour point is the policy that sampled: every ratio is 1; before the second update
  # the policy has moved.
  np.testing.assert_allclose(ledger['ratio_behaviour_BT'], 1.0, atol=1e-5)
  assert np.abs(ledger['ratio_offpolicy_BT'] - 1).max() > 1e-4
  np.testing.assert_allclose(ledger['mismatch_BT'], 0.01, atol=1e-5)
  np.testing.assert_array_equal(ledger['advantages_B'], batch.advantages_B)
  config, restored = ledger.params(1)
  assert config == mc
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(moved)):
    np.testing.assert_array_equal(a, b)
