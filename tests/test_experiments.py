"""experiments/: benchmarks, profiler, eval.py and plot_attention.py (the demo and gpu_check have
test files of their own)."""

import argparse
import json
import logging
import os
import pathlib
import subprocess
import sys
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import synthetic_text
from matplotlib import image

from jaxformer import cli, config, files, scoring, trainer, translation
from jaxformer.flops import forward_flops

ROOT = pathlib.Path(__file__).resolve().parents[1]



def test_bench_answers_help():
  result = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'bench'), '--help'],
                          capture_output=True, text=True, check=True)
  assert '--only' in result.stdout and 'data' in result.stdout and '--fast-path' in result.stdout
  bad = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'bench'), '--only', 'train',
                        '--execution', 'loss_chunk=0'], capture_output=True, text=True)
  assert bad.returncode == 2 and 'Traceback' not in bad.stderr
  assert bad.stderr.strip().splitlines()[-1].endswith(
      "--execution: 'loss_chunk=0': model.execution.loss_chunk must be >= 1, got 0.")
  bad = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'bench'), '--only', 'train',
                        '--execution', 'loss_chunk'], capture_output=True, text=True)
  assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith(
      "--execution: 'loss_chunk': expected NAME=VALUE[,NAME=VALUE...] or default")
  bad = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'bench'), '--only', 'train',
                        '--time-lock', '/nonexistent/lock'], capture_output=True, text=True)
  assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith(
      '--time-lock: cannot open /nonexistent/lock: No such file or directory')


def test_bench_train_reports_mfu_against_its_measured_peak():
  # Without the PyTorch peer, which test_torch_peer_matches_jaxformer runs and
  # test_bench_divides_by_the_torch_peer_of_each_case checks the section's use of.
  result = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'bench'), '--only',
                           'train', '--train-case', 'tiny', '--no-torch'], capture_output=True,
                          text=True, check=True, timeout=300,
                          env={**os.environ, 'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=1'})
  report = json.loads(result.stdout)
  train, tiny = report['train'], report['train']['tiny']
  assert report['machine']['backend'] == 'cpu' and train['fast_path'] is False
  assert report['machine']['glibc_tunables'] == 'glibc.malloc.hugetlb=1'
  peak = train['matmul_peak']['peak_gflops']
  assert peak == max(train['matmul_peak']['gflops_by_size'].values()) > 0
  flops = 3 * forward_flops(config.tiny(), 32, 64, 64)
  assert tiny['model_tflops_per_step'] == round(flops / 1e12, 4)
  assert tiny['target_tokens_per_step'] == 2048
  assert tiny['mfu'] == pytest.approx(flops / tiny['step_s_median'] / 1e9 / peak, rel=1e-2)
  assert tiny['step_s_range'][0] <= tiny['step_s_median'] <= tiny['step_s_range'][1]
  assert tiny['step_buffers_gb'] >= 0 and not tiny['remat']
  assert tiny['execution']['loss_chunk'] == 1024
  assert tiny['target_tokens_per_s_pipelined'] == pytest.approx(
      2048 / tiny['step_s_pipelined'], rel=1e-2)  # steps queued back to back, as in training


def test_bench_processes_compile_side_by_side_and_time_in_turn(tmp_path):
  """bench --time-lock: a timing waits for every compile and every other timing; compiles do
  not wait for each other."""
  sys.path.insert(0, str(ROOT / 'experiments'))
  from bench.common import turn  # pylint: disable=g-import-not-at-top
  lock, events = str(tmp_path / 'lock'), []
  first_in, second_in = threading.Event(), threading.Event()

  def hold(name, compiling, entered, wait_for=None):
    with turn(lock, compiling=compiling):
      events.append(f'{name} in')
      entered.set()
      if wait_for is not None:  # the first compile stays until the second is in (or 10 s)
        wait_for.wait(10)
      time.sleep(0.1)
      events.append(f'{name} out')

  first = threading.Thread(target=hold, args=('compile 1', True, first_in, second_in))
  first.start()
  first_in.wait()
  others = [threading.Thread(target=hold, args=('time', False, threading.Event())),
            threading.Thread(target=hold, args=('compile 2', True, second_in))]
  for thread in others:  # the timing asks first, while compile 1 holds the lock
    thread.start()
    time.sleep(0.05)
  for thread in [first, *others]:
    thread.join()
  # The second compile went in beside the first; the timing only after both were out.
  assert events.index('compile 2 in') < events.index('compile 1 out')
  assert events.index('time in') > max(events.index('compile 1 out'),
                                       events.index('compile 2 out'))
  with turn(None):  # no lock: nothing to wait for
    pass


def test_bench_execution_values_are_parsed_as_set_parses_them():
  """--execution's values get Execution's types (a bool, a dtype), not strings that pass for
  true; an unknown name or a bad value is a usage error naming it."""
  sys.path.insert(0, str(ROOT / 'experiments'))
  from bench import train as bench_train  # pylint: disable=g-import-not-at-top
  assert bench_train.execution_changes('remat=false,norm_dtype=bfloat16,loss_chunk=4096') == {
      'remat': False, 'norm_dtype': jnp.dtype(jnp.bfloat16), 'loss_chunk': 4096}
  assert bench_train.execution_changes('default') == {}
  with pytest.raises(argparse.ArgumentTypeError, match="'remat=maybe': expected bool"):
    bench_train.execution_changes('remat=maybe')
  with pytest.raises(argparse.ArgumentTypeError, match="'chunk=1': unknown chunk; Execution has"):
    bench_train.execution_changes('chunk=1')


def test_bench_compiler_options_reach_the_timed_program_alone(tmp_path):
  """--compiler-option's values are typed as XLA takes them, and reach XLA for the step's
  program alone: a dump folder named that way holds that one module."""
  sys.path.insert(0, str(ROOT / 'experiments'))
  from bench import train as bench_train  # pylint: disable=g-import-not-at-top
  assert bench_train.compiler_option('xla_gpu_enable_triton_gemm=false') == (
      'xla_gpu_enable_triton_gemm', False)
  assert bench_train.compiler_option('xla_gpu_autotune_level=0') == ('xla_gpu_autotune_level', 0)
  with pytest.raises(argparse.ArgumentTypeError, match='expected xla_NAME=VALUE'):
    bench_train.compiler_option('triton=false')
  result = bench_train._time_train_step(  # pylint: disable=protected-access
      config.tiny(), 4, 16, 1, 1, 1.0, compiler_options={'xla_dump_to': str(tmp_path)})
  assert result['target_tokens_per_s'] > 0
  # Only the step's program was compiled with them (the state's init, the batch: not).
  assert len({p.name.split('.')[0] for p in tmp_path.iterdir()}) == 1


def test_bench_divides_by_the_torch_peer_of_each_case(monkeypatch):
  """The ratio jaxformer / torch per case, from bench_torch.py's JSON (faked here: torch is an
  optional extra; test_torch_peer_matches_jaxformer checks the peer where torch is installed);
  a failed peer is reported, not raised."""
  sys.path.insert(0, str(ROOT / 'experiments'))
  from bench import train as bench_train  # pylint: disable=g-import-not-at-top
  peer = {'torch': 'x', 'cases': {'tiny': {'target_tokens_per_s': 400.0}},
          'cases_eager': {'tiny': {'target_tokens_per_s': 800.0}}}
  calls, exits = [], [0, 1]

  def fake_run(command, **kwargs):
    calls.append(command)
    return subprocess.CompletedProcess(command, exits[len(calls) - 1], stdout=json.dumps(peer),
                                       stderr='torch.OutOfMemoryError: CUDA out of memory\n')
  monkeypatch.setattr(bench_train.importlib.util, 'find_spec', lambda name: True)
  monkeypatch.setattr(bench_train.subprocess, 'run', fake_run)
  assert bench_train.torch_peer(['tiny', 'base']) == peer
  assert calls[0][-2:] == ['--case=tiny', '--case=base']
  assert calls[0][1].endswith('experiments/bench_torch.py')
  results = {'tiny': {'target_tokens_per_s': 1000.0}, 'base': {'target_tokens_per_s': 5.0}}
  assert bench_train.add_ratios(results, peer) == peer
  assert bench_train.torch_peer() == {
      'error': 'bench_torch.py exited with 1: torch.OutOfMemoryError: CUDA out of memory'}
  assert results['tiny']['ratio_to_torch'] == 2.5 and 'ratio_to_torch' not in results['base']
  assert results['tiny']['ratio_to_torch_eager'] == 1.25


def test_bench_loop_runs_each_case_at_each_depth_of_the_queue(monkeypatch):
  """--steps-in-flight: every case at every depth, each busy share against 'alone' at its own
  depth; the trainer's depth and jaxformer's log level are back as they were after (a level
  left at WARNING hid the next tests' INFO lines from caplog). The runs are faked (the real ones
  take minutes): a run's rate says which depth it trained at and whether it had periodic work."""
  sys.path.insert(0, str(ROOT / 'experiments'))
  from bench import loop  # pylint: disable=g-import-not-at-top
  default, runs = trainer.STEPS_IN_FLIGHT, []

  def fake_train(model, train_cfg, workdir, train, validation, optim):
    depth = trainer.STEPS_IN_FLIGHT
    periodic = validation is not None
    runs.append((depth, periodic, train_cfg.checkpoint_steps_to_average))
    rate = 100.0 * (0.5 + (depth > default) / 4 if periodic else 1.0)
    return {'time': {'total_s': 1.0 + (train_cfg.num_steps - 1) / rate, 'first_step_s': 1.0}}
  monkeypatch.setattr(trainer, 'train', fake_train)
  level = logging.getLogger('jaxformer').level
  result = loop.run(steps=36, rounds=2, in_flight=[default, 16])
  restored = trainer.STEPS_IN_FLIGHT
  assert restored == default and logging.getLogger('jaxformer').level == level
  assert runs[0] == (default, True, False)  # the short run that compiles
  assert len(runs) == 1 + 2 * 6
  shares = {name: (case['steps_in_flight'], case['busy_share'])
            for name, case in result['cases'].items()}
  assert shares == {'alone': (default, 1.0), 'every save': (default, 0.5),
                    'the recipe': (default, 0.5), 'alone, 16 in flight': (16, 1.0),
                    'every save, 16 in flight': (16, 0.75),
                    'the recipe, 16 in flight': (16, 0.75)}
  assert result['cases']['alone, 16 in flight']['steps_per_s_after_first'] == [100.0, 100.0]


def test_torch_peer_matches_jaxformer(monkeypatch):
  """Where torch is installed (jaxformer[bench]): the peer has jaxformer's parameters plus the
  two stack LayerNorms nn.Transformer adds, the paper's lrate, the config's dropout rates, its
  attention is PyTorch's fused scaled_dot_product_attention (the decoder's by its causal hint,
  with no mask), its Adam the fused one, and it times the tiny case (eager on a CPU: its
  torch.compile takes most of a minute here, and runs on GPU hosts)."""
  pytest.importorskip('torch')
  from jaxformer import optim  # pylint: disable=g-import-not-at-top
  from jaxformer.model import parameter_count  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, str(ROOT / 'experiments'))
  import bench_torch  # pylint: disable=g-import-not-at-top
  for cfg in (config.tiny(), config.base()):
    ours = parameter_count(cfg)
    peer = sum(p.numel() for p in bench_torch.PaperTransformer(cfg).parameters())
    assert peer == ours + 2 * 2 * cfg.d_model
    schedule = optim.lrate_schedule(cfg.d_model, config.OptimConfig().warmup_steps)
    for count in (0, 99, 3999, 50_000):
      peer_lr = bench_torch._lrate(cfg)(count)  # pylint: disable=protected-access
      assert peer_lr == pytest.approx(float(schedule(count)), rel=1e-5)
  cfg = config.tiny().replace(dropout_rate=0.3, attention_dropout_rate=0.1, relu_dropout_rate=0)
  core = bench_torch.PaperTransformer(cfg).core  # drops what jaxformer drops, at its rates
  decoder = core.decoder.layers[0]
  assert (decoder.dropout1.p, decoder.self_attn.dropout, decoder.multihead_attn.dropout,
          decoder.dropout.p) == (0.3, 0.1, 0.1, 0.0)
  assert core.encoder.layers[0].self_attn.dropout == 0.1
  import torch  # pylint: disable=g-import-not-at-top
  calls = []
  sdpa = torch.nn.functional.scaled_dot_product_attention

  def counted(q, k, v, mask=None, dropout_p=0.0, is_causal=False, **kwargs):
    calls.append((mask is None, is_causal))
    return sdpa(q, k, v, mask, dropout_p, is_causal, **kwargs)
  monkeypatch.setattr(torch.nn.functional, 'scaled_dot_product_attention', counted)
  tokens = torch.randint(3, cfg.vocab_size, (2, 8))
  bench_torch.PaperTransformer(cfg)(tokens, tokens)
  layers = cfg.num_layers
  assert sorted(calls) == sorted([(True, False)] * 2 * layers + [(True, True)] * layers)
  result = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'bench_torch.py'),
                           '--case', 'tiny'], capture_output=True, text=True, check=True,
                          timeout=300)
  tiny = json.loads(result.stdout)['cases']['tiny']
  assert tiny['target_tokens_per_step'] == 2048 and tiny['dtype'] == 'float32'
  assert tiny['fused_adam'] and not tiny['compiled']
  assert 'cases_eager' not in json.loads(result.stdout)  # the second row: GPU (or --eager)
  assert tiny['target_tokens_per_s'] == pytest.approx(2048 / tiny['step_s_median'], rel=1e-2)


def test_bench_memory_compiles_the_step_and_reports_its_buffers():
  sys.path.insert(0, str(ROOT / 'experiments'))
  from bench import memory  # pylint: disable=g-import-not-at-top
  report = memory.run(preset='tiny', rows=16, row_len=64, cases=((False, 1), (False, 4)))
  assert len(report) == 2
  sizes = {name.split('tokens_')[1]: case['temp_mb'] for name, case in report.items()}
  assert all(case['arguments_mb'] > 0 for case in report.values())
  assert sizes['remat_False_accum_4'] < sizes['remat_False_accum_1']  # a quarter of the batch


def test_bench_decode_fast_path_counts_the_output_tokens(shared_data):
  """The GPU's decode case (run here on CPU with the tiny preset): sources of one 32-wide
  bucket, outputs to the length limit (64: tiny's max_len), tokens/s = tokens / seconds."""
  sys.path.insert(0, str(ROOT / 'experiments'))
  from bench import decode  # pylint: disable=g-import-not-at-top
  report = decode.base_fast_path(shared_data, batch_size=8, sentences=16, preset='tiny')
  assert report['sentences'] == 16 and report['attention'] == 'einsum'
  for search in ('greedy', 'beam4'):
    case = report[search]
    assert 0 < case['tokens'] <= 16 * 64
    assert case['target_tokens_per_s'] == pytest.approx(case['tokens'] / case['seconds'],
                                                        rel=1e-2)  # seconds: 3 decimals


def test_profile_step_splits_a_step_by_model_part():
  result = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'profile_step.py'),
                           '--preset', 'tiny', '--rows', '4', '--row-len', '16'],
                          capture_output=True, text=True, check=True, timeout=300)
  report = json.loads(result.stdout)
  parts = report['op_seconds_by_part']
  assert {'feed-forward', 'softmax projection + loss',
          'attention: q, k, v, out projections'} <= set(parts)
  assert parts['feed-forward'] > 0 and parts['softmax projection + loss'] > 0
  assert report['wall_s'] > 0


def test_profile_step_splits_a_beam_search_by_part():
  result = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'profile_step.py'),
                           '--preset', 'tiny', '--rows', '2', '--search', 'beam4'],
                          capture_output=True, text=True, check=True, timeout=300)
  parts = json.loads(result.stdout)['op_seconds_by_part']
  assert parts['reorder beams (cache and sequences)'] > 0 and parts['top-k of the next tokens'] > 0
  assert parts['feed-forward'] > 0 and parts['output projection and log-softmax'] > 0


def _script(name: str):
  sys.path.insert(0, str(ROOT / 'experiments'))
  return __import__(name)


def test_eval_script_scores_local_files(workdir, tmp_path):
  text = synthetic_text(12, seed=4)
  (tmp_path / 'test.src').write_text('\n'.join(text.src) + '\n')
  (tmp_path / 'test.ref').write_text('\n'.join(text.tgt) + '\n')
  result = subprocess.run(
      [sys.executable, str(ROOT / 'experiments' / 'eval.py'), '--workdir', str(workdir),
       '--src', str(tmp_path / 'test.src'), '--ref', str(tmp_path / 'test.ref'),
       '--output', str(tmp_path / 'hyps.txt')], capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  hyps = (tmp_path / 'hyps.txt').read_text().splitlines()
  assert len(hyps) == 12 and summary['segments'] == 12
  assert summary['sacrebleu'] == pytest.approx(round(scoring.sacre_bleu(hyps, text.tgt)[0], 2))
  assert result.stdout.startswith('sacreBLEU ')


def test_eval_script_errors_are_one_line(workdir, tmp_path):
  missing = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'eval.py'), '--workdir',
                            str(tmp_path / 'nowhere')], capture_output=True, text=True,
                           timeout=120)
  assert missing.returncode == 1 and 'error: ' in missing.stderr.splitlines()[-1]
  no_data = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'eval.py'), '--workdir',
                            str(workdir), '--tfds-data-dir', str(tmp_path)], capture_output=True,
                           text=True, timeout=120)
  assert no_data.returncode == 1
  assert 'not prepared' in no_data.stderr.splitlines()[-1]


def test_plot_attention_writes_images(workdir, tmp_path):
  result = subprocess.run(
      [sys.executable, str(ROOT / 'experiments' / 'plot_attention.py'), '--workdir', str(workdir),
       '--sentence', 'the man who sees the dog walks', '--out', str(tmp_path)],
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  names = sorted(p.name for p in tmp_path.glob('*.png'))
  assert names == ['attention_layer1.png', 'attention_layer1_heads.png', 'attention_layer2.png',
                   'attention_layer2_heads.png', 'positional_encoding.png']
  for name in names:
    pixels = image.imread(tmp_path / name)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert pixels.std() > 0.01  # not a blank image


def test_bench_startup_times_a_resumed_run_to_its_first_step_and_ends_it():
  """A stand-in for `jaxformer train` whose progress bar reaches step 2 after 0.6 s and step 3
  0.3 s later: the first step ends at 0.6 s and started at 0.3 s; the process is ended there."""
  sys.path.insert(0, str(ROOT / 'experiments'))
  from bench import startup  # pylint: disable=g-import-not-at-top
  fake = ('import sys, time\n'
          'for step, pause in ((1, 0.0), (2, 0.6), (3, 0.3), (4, 30.0)):\n'
          '  time.sleep(pause)\n'
          "  sys.stderr.write(f'\\rtraining: | {step}/5 [00:01<00:01]'); sys.stderr.flush()\n")
  start = time.perf_counter()
  end, begin = startup._first_step_s([sys.executable, '-c', fake], dict(os.environ), 2)  # pylint: disable=protected-access
  assert 0.6 <= end < 2.0 and begin == pytest.approx(end - 0.3, abs=0.25)
  assert time.perf_counter() - start < 10  # ended, not waited for
  # On a GPU the bar skips counts: 1, then 2 and 4 drawn together; step 3 is marked by 4.
  skips = ('import sys, time\n'
           "sys.stderr.write('\\rtraining: | 1/9 [00:00<?]'); sys.stderr.flush(); time.sleep(0.6)\n"
           "sys.stderr.write('\\rtraining: | 2/9 [00:01<00:01]\\rtraining: | 4/9 [00:01<00:01]')\n"
           'sys.stderr.flush(); time.sleep(30)\n')
  end, begin = startup._first_step_s([sys.executable, '-c', skips], dict(os.environ), 2)  # pylint: disable=protected-access
  assert 0.6 <= end < 2.0 and begin == pytest.approx(end, abs=0.1)
  with pytest.raises(RuntimeError, match='ended before step 2'):
    startup._first_step_s([sys.executable, '-c', 'pass'], dict(os.environ), 2)  # pylint: disable=protected-access


def test_backend_parity_explains_each_difference_by_teacher_forced_scores(workdir, tmp_path):
  parity = _script('backend_parity')
  model = tmp_path / 'exported'
  assert cli.main(['export', '--model', str(workdir), str(model)]) == 0
  (tmp_path / 'src.txt').write_text('\n'.join(synthetic_text(3, seed=3).src) + '\n')
  run = tmp_path / 'a.json'
  with pytest.raises(files.WriteError, match='no such folder for the report'):  # at once
    parity.main(['decode', '--model', 'nowhere', '--out', str(tmp_path / 'no' / 'a.json')])
  assert parity.main(['decode', '--model', str(model), '--src', str(tmp_path / 'src.txt'),
                      '--out', str(run)]) == 0
  a = json.loads(run.read_text())
  assert len(a['greedy']) == len(a['beam4']) == len(a['beam4_scores']) == 3
  b = json.loads(run.read_text())
  b['beam4'][2] = b['beam4'][2][:-1]  # a shorter output: it parts where the first one ended
  report = parity.compare(a, b, str(model), 'default')
  assert report['greedy'] == {'differ': 0, 'cases': []} and report['beam4']['differ'] == 1
  case = report['beam4']['cases'][0]
  assert case['sentence'] == 2 and case['part_at'] == len(a['beam4'][2]) - 1
  # Teacher forcing gives the distributions greedy search chose from (an independent path):
  # each greedy piece is the most likely non-padding piece given the ones before it.
  translator = translation.Translator.from_pretrained(str(model))
  for sentence, hyp in zip(a['sources'], a['greedy']):
    lp = parity.log_probs(translator, translator.tokenizer.encode([sentence])[0], [hyp])[0]
    np.testing.assert_array_equal(lp[:len(hyp), 1:].argmax(-1) + 1, hyp)
  assert case['score'][1] != pytest.approx(case['score'][0])
  assert case['gap_at_part'] == pytest.approx(abs(np.subtract(*case['piece_log_prob'])))


def test_bench_serve_load_runs_its_clients_apart_and_checks_every_answer(translator):
  """bench --only serve's clients (serve_load.py, a process of their own): kept or fresh
  connections, every request counted; an answer short of its sentences fails the run."""
  sys.path.insert(0, str(ROOT / 'experiments'))
  from bench import serve as bench_serve  # pylint: disable=g-import-not-at-top

  class Short:  # answers one sentence fewer than it is given
    decoding = translator.decoding

    def run(self, request):
      return ['x'] * (len(request.src) - 1)


  clients = [[['the man sees a dog'], ['a red cat', 'the dog walks']]] * 3
  with bench_serve._served(translator) as url:  # pylint: disable=protected-access
    for keep_alive in (True, False):
      result = bench_serve._load(url, clients, keep_alive)  # pylint: disable=protected-access
      assert (result['clients'], result['requests'], result['sentences']) == (3, 6, 9)
      assert result['keep_alive'] is keep_alive
      assert 0 < result['p50_s'] <= result['p99_s'] < result['seconds']
  with bench_serve._served(Short()) as url, pytest.raises(  # pylint: disable=protected-access
      SystemExit, match=r'3 client.s. failed; the first: ValueError: HTTP 500: .*the search '
                        r'of \d+ sentences gave \d+ answers'):  # (the server's own check)
    bench_serve._load(url, clients)  # pylint: disable=protected-access
  engine = bench_serve._engine(  # pylint: disable=protected-access
      translator, ['the man sees a dog', 'a red cat'], count=32)
  assert set(engine) == {'1_at_a_time', '16_at_a_time'} and min(engine.values()) > 0


def test_bench_ending_as_translations_runs_each_sentence_to_its_translations_end(translator):
  sys.path.insert(0, str(ROOT / 'experiments'))
  from bench import decode  # pylint: disable=g-import-not-at-top
  sentences = ['the man sees a dog', 'a small red house', 'the dog', 'a cat under the tree']
  report = decode.ending_as_translations(translator, sentences,
                                         translator.config.replace(num_layers=1), repeats=1)
  assert report['sentences'] == 4
  for search in ('greedy', 'beam4'):
    case = report[search]
    assert case['same_outputs'] and case['ran_to_their_ends']
    assert case['groups_s'] > 0 and case['all_rows_s'] > 0 and case['groups_speedup'] > 0
