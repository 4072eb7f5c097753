"""Tests of jtc.analysis.replay: replaying the run's own objective on its ledger reproduces its
logged loss and gradient norm, and other objectives replay on the same frozen rollouts."""
import os

import numpy as np
import pytest

from jtc.analysis import ledger as ledger_lib
from jtc.analysis import metric_writer
from jtc.analysis import replay as replay_lib


@pytest.mark.slow  # replays every objective; the ledger itself is in CI (test_ledger.py)
def test_replay_of_the_runs_objective_reproduces_its_logged_loss(run_with_ledger):
  ledger = ledger_lib.load(run_with_ledger, 2)
  logged = metric_writer.read_jsonl(os.path.join(run_with_ledger, 'metrics.jsonl'))[2]
  again = replay_lib.reproduce(ledger)
  assert again['loss'] == pytest.approx(logged['loss'], rel=1e-4, abs=1e-6)
  assert again['grad_norm'] == pytest.approx(logged['grad_norm'], rel=1e-4)
  out = replay_lib.replay(ledger, ['gspo', 'grpo'], contexts=2)
  for point in ledger.points:
    gspo = out[point]['objectives']['gspo']
    assert len(gspo['coef']) == ledger['completion_BT'].shape[0]
    assert out[point]['cosine'][0][0] == pytest.approx(1.0, abs=1e-5)
    assert -1.0 <= out[point]['cosine'][0][1] <= 1.0
  # Replay at the behaviour point with the run's own objective gives the run's own ledger.
  np.testing.assert_allclose(out['behaviour']['objectives']['gspo']['coef'],
                             ledger['coef_behaviour_BT'], rtol=1e-5, atol=1e-9)
