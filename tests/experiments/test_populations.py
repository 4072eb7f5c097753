"""experiments.populations and the runner's population path: a sweep's seeds (and varied
hyper-parameters) grouped into programs, trained by the real trainer, read back as runs."""
import dataclasses
import json
import os

import numpy as np
import pytest

from experiments import common
from experiments import populations
from experiments import run as run_lib
from experiments import schedule
from experiments import sweeps as sweeps_lib


def test_programs_group_seeds_and_variable_keys_and_split_the_rest():
  sweep = sweeps_lib.get_sweep('table1')  # 5 methods x 3 learning rates
  specs = schedule.make_specs(sweep, 8, first_seed=8)
  progs = populations.programs(specs)
  # The learning rate varies inside a program; the loss (and DFPO's clip gating) does not.
  assert len(progs) == len({(s.config_path, s.run.name.split('_learning')[0]) for s in specs})
  assert sorted(s.run_id for p in progs for s in p.specs) == sorted(s.run_id for s in specs)
  for p in progs:
    assert p.first_seed == 8 and p.size == 8
    assert dict(p.vary) == {'optim.learning_rate': (5e-05, 0.0001, 0.0002)}
    assert len(p.specs) == 24 and len({s.config_path for s in p.specs}) == 1
  # A gap in the seeds splits a program: seeds 0-1 and 3 are two contiguous ranges.
  gap = [
      dataclasses.replace(
          specs[0], seed=k, overrides=tuple((o, k if o == 'seed' else v)
                                            for o, v in specs[0].overrides))
      for k in (0, 1, 3)
  ]
  assert sorted((p.first_seed, p.size) for p in populations.programs(gap)) == [(0, 2), (3, 1)]
  # The trainer writes a one-member program (one seed, nothing varied) as a single run, in the
  # workdir itself (a --smoke sweep's programs); a larger program's members under members/.
  for p in populations.programs(gap):
    dirs = {p.member_dir('W', s) for s in p.specs}
    assert dirs == ({'W'} if p.size == 1 else {f'W/members/seed{k}' for k in (0, 1)})


@pytest.mark.slow  # ~1 min
def test_a_sweep_trains_its_seeds_as_a_population_and_reads_members_as_runs(tmp_path):
  root, work = tmp_path / 'results', tmp_path / 'w'
  runs = 'gspo_learning_rate0.0001,dfpo_min_replace_learning_rate0.0001'
  rc = run_lib.main([
      'table1_confirm', '--smoke', '--seeds', '2', '--runs', runs, '--jobs', '2', '--workroot',
      str(work)
  ], results_root=str(root))
  assert rc == 0
  sweep = sweeps_lib.get_sweep('table1_confirm', smoke=True)
  summaries = common.load_summaries(str(root / 'smoke' / 'table1_confirm'))
  assert sorted((s['run'], s['seed']) for s in summaries) == sorted(
      (r, k) for r in runs.split(',') for k in (sweep.first_seed, sweep.first_seed + 1))
  for s in summaries:
    assert s['engine'] == 'population' and s['final']['step'] == sweep.num_steps
    member_dir = os.path.join(s['population_workdir'], 'members', f'seed{s["seed"]}')
    with open(os.path.join(member_dir, 'member.json')) as f:
      assert json.load(f)['seed'] == s['seed']
  # Two programs (one per loss), each of the two seeds; the same command again launches nothing.
  assert len({s['population_workdir'] for s in summaries}) == 2
  part = dataclasses.replace(sweep, runs=tuple(r for r in sweep.runs if r.name in runs))
  out = schedule.run_sweep(part, seeds=2, jobs=2, first_seed=sweep.first_seed,
                           results_dir=str(root / 'smoke' / 'table1_confirm'), workroot=str(work),
                           log=lambda *a: None)
  assert {status for status, _ in out.values()} == {'skipped'}


KEYS = ('reward_mean', 'entropy', 'approx_kl', 'eval/avg@2')


@pytest.mark.slow  # two local processes joined by jax.distributed: about a minute
def test_a_population_over_two_processes_gives_the_runs_of_one_process(tmp_path):
  argv = ['table1_confirm', '--smoke', '--seeds', '2', '--runs', 'gspo_learning_rate0.0001']
  curves = []
  for n in (1, 2):
    root = tmp_path / f'results{n}'
    rc = run_lib.main(argv +
                      ['--processes', str(n), '--workroot',
                       str(tmp_path / f'w{n}')], results_root=str(root))
    assert rc == 0
    summaries = common.load_summaries(str(root / 'smoke' / 'table1_confirm'))
    curves.append({(s['seed'], k): s['curves'][k]['value'] for s in summaries for k in KEYS})
    if n == 2:
      (workdir,) = {s['population_workdir'] for s in summaries}
      assert os.path.exists(os.path.join(workdir, 'stderr.1.log'))
      assert '--config.mesh.population=2' in summaries[0]['command']
  assert curves[0].keys() == curves[1].keys() and len(curves[0]) == 2 * len(KEYS)
  for key, values in curves[0].items():  # the same rollouts, updates within float rounding
    np.testing.assert_allclose(curves[1][key], values, rtol=1e-4, atol=1e-6, err_msg=str(key))


def test_bad_process_counts_are_named_before_anything_runs(tmp_path, capsys):
  for argv in (['--processes', '0'], ['--launcher', 'srun -N 2']):
    with pytest.raises(SystemExit):
      run_lib.main(['table1_confirm', '--smoke', '--workroot',
                    str(tmp_path)] + argv, results_root=str(tmp_path / 'r'))
    assert 'a --launcher needs --processes N' in capsys.readouterr().err
  assert not os.path.exists(tmp_path / 'r')
