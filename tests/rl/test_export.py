"""`jtc export` (jtc.rl.export): a run's latest checkpoint comes back from the Hugging Face
directory it writes as the same parameters (hf_import reads them), with a tokenizer that encodes,
decodes and templates every text as the run's own; a workdir without a run, a population without
--member and an OUT with files are refused. (A real smoke run's export is `jtc export` on the
workdir of tests/conftest.py's run, slow below.)"""
import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import common
from jtc.models import bundles
from jtc.models import hf_import
from jtc.models import tokenizer as tokenizer_lib
from jtc.rl import export
from jtc.rl import workdir as workdir_lib


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  """A workdir as a run of the shipped base policy leaves it: config.json and a checkpoint whose
  parameters differ from the bundle's (so the export cannot pass by reading the bundle)."""
  workdir = tmp_path_factory.mktemp('run')
  c = common.get_config('smoke')
  workdir_lib.record_config(str(workdir), c, c.num_steps)
  bundle = bundles.load_policy_bundle('base')
  params = jax.tree.map(lambda x: np.asarray(x) + np.float32(0.01), bundle.params)
  with ocp.CheckpointManager(os.path.join(workdir, 'checkpoints'), item_names=('state',)) as m:
    m.save(2, args=ocp.args.Composite(state=ocp.args.StandardSave({'params': params, 'step': 2})))
    m.wait_until_finished()
  return str(workdir), params, bundle.tokenizer


def test_the_export_reads_back_as_the_runs_parameters_and_tokenizer(run, tmp_path):
  workdir, params, char_tokenizer = run
  out = str(tmp_path / 'hf')
  assert export.export(workdir, out) == 2
  assert sorted(os.listdir(out)) == [
      'config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json'
  ]
  _, loaded = hf_import.load_hf_checkpoint(out)
  for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), b)
  hf = tokenizer_lib.HFTokenizer.from_dir(out)
  for text in ('What is 23+58?', 'The answer is 81.', '23+50=73,73+8=81,so 81.'):
    assert hf.encode(text) == char_tokenizer.encode(text)
    assert hf.decode(char_tokenizer.encode(text)) == text
    assert hf.apply_chat_template(text) == char_tokenizer.apply_chat_template(text)
  assert (hf.eos_id, hf.pad_id, hf.bos_id) == (char_tokenizer.eos_id, char_tokenizer.pad_id,
                                               char_tokenizer.bos_id)


def test_what_cannot_be_exported_is_named_and_nothing_is_written(run, tmp_path):
  workdir, _, _ = run
  (tmp_path / 'full').mkdir()
  (tmp_path / 'full' / 'x').write_text('mine')
  with pytest.raises(ValueError, match='not an empty directory'):
    export.export(workdir, str(tmp_path / 'full'))
  with pytest.raises(ValueError, match='holds no run'):
    export.export(str(tmp_path), str(tmp_path / 'o'))
  with pytest.raises(ValueError, match='--member is not needed'):
    export.export(workdir, str(tmp_path / 'o'), member=0)
  assert not (tmp_path / 'o').exists() and (tmp_path / 'full' / 'x').read_text() == 'mine'
  pop = tmp_path / 'pop'
  pop.mkdir()
  c = common.get_config('smoke')
  with c.unlocked():
    c.population.size = 2
  (pop / 'config.json').write_text(json.dumps({'config': c.to_dict()}))
  with pytest.raises(ValueError, match='--member N'):
    export.export(str(pop), str(tmp_path / 'o'))


@pytest.mark.slow
def test_a_real_runs_export_loads_in_transformers_with_the_same_logits(run_with_ledger, tmp_path):
  transformers = pytest.importorskip('transformers')
  torch = pytest.importorskip('torch')
  out = str(tmp_path / 'hf')
  export.export(run_with_ledger, out)
  config, params = hf_import.load_hf_checkpoint(out)
  model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  tokens = np.array([[5, 17, 30, 41, 7]], np.int32)
  with torch.no_grad():
    ref = model(torch.from_numpy(tokens).long()).logits.numpy()
  from jtc.models import model as model_lib  # pylint: disable=import-outside-toplevel
  mask = np.ones_like(tokens)
  got = model_lib.forward(params, config, tokens, model_lib.positions_from_mask(mask), mask)
  np.testing.assert_allclose(np.asarray(got.logits_BLV), ref, rtol=1e-4, atol=1e-4)
