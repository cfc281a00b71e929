"""What each `jaxformer` command does with its parsed arguments (jaxformer.cli parses them and
calls these): train (`recipe_of`: the recipe its flags make), eval, translate, score, serve,
export, average, params. Each raises what goes wrong (a JaxformerError, KeyboardInterrupt);
`cli.main` reports it.
"""

import argparse
import dataclasses
import json
import logging
import os
import pathlib
import signal
import sys
import threading
from typing import Any

import jax
import tqdm

from jaxformer import (arguments, checkpoint, data, export, files, finetune, parallel, protocol,
                       recipes, scoring, serving, trainer)
from jaxformer import config as config_lib
from jaxformer import text as text_lib
from jaxformer.config import DataConfig, OptimConfig, SettingError, TrainConfig
from jaxformer.model import parameter_count
from jaxformer.recipes import auto as auto_recipe
from jaxformer.translation import Translator


class _CommandLog(logging.StreamHandler):
  """A command's log on stderr: jaxformer's records (and those of the loggers named in `own`)
  from `level`, every other library's from WARNING only, each on a line of its own above the
  progress bars (tqdm.write clears them, writes the line, draws them again) rather than
  appended to a bar's line. At INFO the libraries speak of what is not wrong: jax of each
  accelerator plugin it could not load (a TPU's, on every CPU and GPU host), orbax of every
  checkpoint step. A filter here, not the loggers' levels, which outlive the command in a
  process that goes on (a test's, a notebook's)."""

  def __init__(self, own: tuple[str, ...], level: int):
    super().__init__()
    self.setLevel(level)  # (logging drops what is below it before the filter)
    self.own = ('jaxformer', *own)

  def filter(self, record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or record.name.split('.')[0] in self.own

  def emit(self, record: logging.LogRecord) -> None:
    try:
      tqdm.tqdm.write(self.format(record), file=self.stream)
    except Exception:  # noqa: BLE001  (logging's rule: a handler never raises)
      self.handleError(record)


def setup_logging(*own: str, level: int = logging.INFO) -> None:
  """Every command's logging (_CommandLog's): from INFO for the long ones (train, serve, the
  demo), from WARNING for the others, one format for all (force: absl's first record, orbax's at
  import, has set up logging's default handler already)."""
  logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s',
                      handlers=[_CommandLog(own, level)], force=True)


# The sections whose every field is also a flag of `jaxformer train` (--num-steps for --set
# train.num_steps=...), made from the fields' help.
SHORTCUTS = (('data', DataConfig), ('train', TrainConfig), ('optim', OptimConfig))


def recipe_of(args: argparse.Namespace) -> recipes.Recipe:
  """The recipe of `args`: --config and --variant, then the shortcut flags spelled as --set,
  then --set itself (which wins)."""
  auto = args.config == 'auto'
  if auto and args.variant:
    raise SettingError('--variant makes a Table 3 row of the base recipe: give --config base.')
  recipe = recipes.AUTO if auto else recipes.load(args.config, args.variant)
  shortcuts = [f'{section}.{field.name}={getattr(args, field.name)}'
               for section, cls in SHORTCUTS
               for field in dataclasses.fields(cls) if getattr(args, field.name, None) is not None]
  shortcuts += ['train.require_accelerator=false'] * args.allow_cpu
  shortcuts += ['model.execution.remat=true'] * args.remat
  assignments = shortcuts + args.assignments
  recipe = recipes.override(recipe, assignments)
  finetune.check_fine_tune_workdir(args.workdir, recipe.train.init_from)  # before any record
  parent = export.model_config(recipe.train.init_from) if recipe.train.init_from else None
  if auto:
    inherited = None if parent is None else (parent[0], data.Tokenizer.from_bytes(
        parent[1], f'the vocabulary of {recipe.train.init_from}'))
    sizing = auto_recipe.recorded(args.workdir, recipe, assignments) or auto_recipe.size(
        recipe, assignments, backend=jax.default_backend(), parent=inherited)
    logging.getLogger('jaxformer.recipes.auto').info(
        '%s (recorded in %s)', '\n  '.join(sizing.reasons),
        auto_recipe.record(args.workdir, sizing))
    recipe = sizing.recipe
  if parent is None or auto:  # (the automatic recipe sized the parent's model itself)
    return recipe
  # Fine-tuning: the parent's model, changed only where --set says so (the trainer checks that
  # only what check_fine_tune allows changed), trained in the recipe's rows.
  model_sets = [a for a in assignments if a.strip().startswith('model.')]
  return recipes.override(dataclasses.replace(recipe, model=parent[0]), model_sets)


def train_command(args: argparse.Namespace) -> int:
  if args.distributed or args.coordinator_address:
    try:
      parallel.initialize(args.coordinator_address, args.num_processes, args.process_id)
    except (ValueError, RuntimeError) as e:  # jax's: no cluster found, or none answering
      raise SettingError(f'--distributed: cannot join a cluster ({str(e).splitlines()[0]}); '
                         'give --coordinator-address, --num-processes and --process-id, or run '
                         'under a launcher jax detects (SLURM, Cloud TPU, ...).') from None
  files.check_workdir(args.workdir)  # before the recipe's work, which may be minutes
  recipe = recipe_of(args)
  if recipe.data.source == 'wmt14':
    data.sources.require_tfds()  # (the core install has no TensorFlow)
  summary = trainer.train_recipe(recipe, args.workdir)
  print(json.dumps(summary, indent=2))
  if summary.get('signal') == 'SIGINT':  # saved; SIGTERM (a preemption) ends with 0
    raise KeyboardInterrupt  # (reported as every command's Ctrl-C: errors.exit_code)
  return 0


def load_translator(path: str, args: argparse.Namespace) -> tuple[Translator, int]:
  """The Translator of any model path (Translator.load) with the flags' decoding, and its step."""
  translator = Translator.load(path, args.average_last, decoding=arguments.decoding_of(args))
  return translator, translator.step


def _test_set(args: argparse.Namespace, lang: str) -> data.ParallelText:
  if args.src or args.ref:
    if not (args.src and args.ref):
      raise data.DataError('--src and --ref go together.')
    return data.read_parallel_text(args.src, args.ref)
  return data.load_wmt14(lang, 'test', source_language=args.source_language,
                         data_dir=args.tfds_data_dir)


def target_language(args: argparse.Namespace) -> str:
  """--target-language, else the language the model's training run recorded (its workdir's
  recipe.json), else the paper's German; where it came from is said when not given."""
  if args.target_language:
    return args.target_language
  if not (found := files.record_near(args.model, 'recipe.json')):
    return 'de'
  path, record = found
  run_data = files.field(record, 'data', dict, str(path), {})
  lang = files.field(run_data, 'target_language', str, str(path), 'de')
  print(f'scoring as {lang}, the target language recorded in {path} (--target-language to '
        'change)', file=sys.stderr)
  return lang


def eval_command(args: argparse.Namespace) -> int:
  lang = target_language(args)
  scoring.check_language(lang)  # before the model is loaded and run
  if not (args.src or args.ref):
    data.sources.require_tfds()  # newstest2014 from tfds (the core install has no TensorFlow)
  output = args.output and pathlib.Path(args.output)
  if output:  # found out before the model loads and translates, not after
    files.check_output(output, 'the hypotheses')
  # Your files are read before the model loads (files that do not pair: found at once);
  # newstest2014 after it (a model path that is wrong: found before tfds is asked).
  text = _test_set(args, lang) if args.src or args.ref else None
  translator, step = load_translator(args.model, args)
  text = text if text is not None else _test_set(args, lang)
  hypotheses = translator.translate(text.src, progress=True)  # (Ctrl-C: nothing written)
  if output:
    files.write_atomically(output, ''.join(h + '\n' for h in hypotheses).encode(),
                           'the hypotheses')
  if warning := scoring.undertrained(hypotheses, step):
    print(f'warning: {warning}', file=sys.stderr)
  result = scoring.scores(hypotheses, text.tgt, lang)
  kept = f'hypotheses in {output}' if output else 'hypotheses not kept (--output FILE keeps them)'
  print('\n'.join(scoring.report(
      result, lang=lang, origin=text.origin, segments=len(text),
      decoding=f'{translator.decoding.describe()}; {kept}')))
  print(json.dumps({**result, 'segments': len(text),
                    'hypotheses': str(output) if output else None}))
  return 0


def translate_command(args: argparse.Namespace) -> int:
  if given := [name for name in arguments.CLIENT_SIDE if getattr(args, name) is not None]:
    raise SettingError(f'--{given[0].replace("_", "-")} is for translating with --server.')
  if args.output:  # found out before the model loads, not after
    files.check_output(args.output, 'the translations')
  if args.nbest:  # (before any input is read)
    protocol.check_nbest(args.nbest, arguments.decoding_of(args))
  source = text_lib.read_input(args.input, args.prefix)  # (so are the input's faults)
  translator = load_translator(args.model, args)[0]
  def translate(lines: list[str], first: int, prefixes: list[str] | None) -> list[Any]:
    return translator.run(protocol.TranslateRequest(lines, args.nbest, prefixes, first),
                          progress=bool(args.input))
  batch = translator.decoding.batch_size * translator.workers  # from a pipe: a batch a worker
  text_lib.translate_lines(source, args.output, batch, translate, args.nbest)
  return 0  # (input that is not UTF-8 stops at that line: a DataError)


def score_command(args: argparse.Namespace) -> int:
  if args.output:  # found out before the scoring, not after
    files.check_output(args.output, 'the scores')
  pairs = data.read_parallel_text(args.src, args.tgt)  # before the model: found out at once
  if empty := [n for n, line in enumerate(pairs.tgt, 1) if not line.strip()]:
    raise data.DataError(f'{args.tgt}:{empty[0]}: an empty target line ({len(empty)} in all): '
                         'there is nothing to score; remove the pair or give its translation.')
  translator = load_translator(args.model, args)[0]
  scores = translator.score(pairs.src, pairs.tgt, progress=True)
  if args.format == 'tsv':
    lines = ['\t'.join([f'{s.log_prob:.6f}', str(s.tokens), f'{s.mean:.6f}'] + (
        [' '.join(f'{x:.6f}' for x in s.token_log_probs)] if args.token_log_probs else []))
             for s in scores]
  else:
    lines = [json.dumps(s.as_dict(args.token_log_probs)) for s in scores]
  output = ''.join(line + '\n' for line in lines)
  if args.output:
    files.write_atomically(args.output, output.encode(), 'the scores')
  else:
    sys.stdout.write(output)
  return 0  # (pairs too long for the model: Translator.score's warning, their lines null or nan)


def serve_command(args: argparse.Namespace) -> int:
  limits = arguments.server_limits_of(args)
  key = arguments.api_key(args.api_key_file, os.environ)
  serving.check_exposure(args.host, key, args.allow_no_key)
  def load() -> tuple[Translator, dict[str, Any]]:  # (once the port is taken)
    translator, step = load_translator(args.model, args)
    return translator, {'model': args.model, 'step': step}

  # SIGTERM (a service manager's stop) drains and ends with 0, as asked; Ctrl-C keeps 130.
  stop = threading.Event()
  previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
  try:
    serving.serve(load, args.host, args.port, limits=limits, api_key=key, stop=stop)
  finally:
    signal.signal(signal.SIGTERM, previous)
  return 0


def export_command(args: argparse.Namespace) -> int:
  if (args.model is None) == (args.path is None):
    raise SettingError('give the model to export once: jaxformer export --model PATH OUT.')
  path = args.model or args.path
  if args.path is not None:
    print('note: `jaxformer export PATH OUT` is an older spelling of `jaxformer export --model '
          'PATH OUT`; it still works.', file=sys.stderr)
  out, step = export.save_as(args.format, path, args.out, average_last=args.average_last,
                             overwrite=args.overwrite)
  print(f'exported step {step} of {path} to {out} ({args.format})')
  return 0


def average_command(args: argparse.Namespace) -> int:
  if args.metric and not args.best:  # (it would be ignored: the last N are the newest)
    raise SettingError(f'--metric {args.metric} ranks checkpoints for --best N; without it, the '
                       'last N are averaged.')
  if args.best:
    metric = args.metric or 'loss'
    out = checkpoint.save_average(args.workdir, best=args.best, metric=metric)
    print(f'averaged the {args.best} checkpoints with the best validation {metric} of '
          f'{args.workdir} into {out}')
  else:
    out = checkpoint.save_average(args.workdir, args.last)
    print(f'averaged the last {args.last} checkpoints of {args.workdir} into {out}')
  return 0


def params_command(args: argparse.Namespace) -> int:
  if args.model:
    if args.preset or args.vocab_size:
      raise SettingError("--model counts that model's parameters: leave out --preset and "
                         '--vocab-size.')
    cfg = export.model_config(args.model)[0]  # (its config alone: no array is read)
    print(f'{args.model} (N={cfg.num_layers}, d_model {cfg.d_model}, vocab {cfg.vocab_size}): '
          f'{parameter_count(cfg):,} parameters')
    return 0
  preset, vocab_size = args.preset or 'base', args.vocab_size or 37000
  cfg = getattr(config_lib, preset)(vocab_size=vocab_size)
  print(f'{preset} (vocab {vocab_size}): {parameter_count(cfg):,} parameters')
  return 0
