"""The `jaxformer` command line: train, eval, translate, export, average, params.

Thin wrappers around library functions. Flags are spelled with dashes (`--num-steps`); older
spellings (`--num_steps`, `eval --workdir`) still work and print a note (older_spellings). Every
model, training and data setting can be changed with `--set SECTION.NAME=VALUE` (SECTION: model,
train, data, optim).
"""

import argparse
import dataclasses
import json
import logging
import math
import os
import pathlib
import sys
import textwrap
import typing
from collections.abc import Callable
from typing import Any

import jax

from jaxformer import (checkpoint, compilation, data, export, files, monitor, parallel,
                       recipes, scoring, serving, trainer)
from jaxformer import config as config_lib
from jaxformer import text as text_lib
from jaxformer.config import DataConfig, OptimConfig, SettingError, TrainConfig
from jaxformer.errors import exit_code
from jaxformer.model import parameter_count
from jaxformer.recipes import auto as auto_recipe
from jaxformer.translation import Translator

_PRESETS = ('tiny', 'base', 'big')


class _Formatter(argparse.RawDescriptionHelpFormatter):
  """Help with each flag's default (where it has one) and the description's own line breaks."""

  def _get_help_string(self, action: argparse.Action) -> str:
    help_text = action.help or ''
    if action.default not in (None, False, [], argparse.SUPPRESS) and action.option_strings:
      help_text += ' (default: %(default)s)'
    return help_text


def positive_int(text: str) -> int:
  """An argparse type: an integer >= 1 (argparse reports anything else in one line)."""
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f'must be an integer >= 1, got {text!r}')
  return value


def non_negative(kind: type) -> Callable[[str], Any]:
  """An argparse type: a finite number of `kind` >= 0 (nan and inf are refused)."""
  def parse(text: str) -> Any:
    try:
      value = kind(text)
    except ValueError:
      value = -1
    if not math.isfinite(value) or value < 0:
      raise argparse.ArgumentTypeError(f'must be a finite number >= 0, got {text!r}')
    return value
  return parse


def port_number(text: str) -> int:
  """An argparse type: a TCP port, 0 to 65535 (0: the system picks a free one)."""
  value = int(text) if text.isdigit() else -1
  if not 0 <= value <= 65535:
    raise argparse.ArgumentTypeError(f'must be a port number from 0 to 65535, got {text!r}')
  return value


def path_arg(text: str) -> str:
  """An argparse type: a path, not an empty string (which would name the current folder)."""
  if not text.strip():
    raise argparse.ArgumentTypeError(f'must be a path, got {text!r}')
  return text


def _flag(parser: argparse._ActionsContainer, name: str, **kwargs: Any) -> None:
  """--name-with-dashes, and --name_with_underscores as a hidden older spelling."""
  dashed = '--' + name.replace('_', '-')
  parser.add_argument(dashed, dest=name, **kwargs)
  if '_' in name:
    alias = {k: v for k, v in kwargs.items() if k in ('action', 'type', 'choices', 'nargs')}
    parser.add_argument('--' + name, dest=name, help=argparse.SUPPRESS,
                        default=kwargs.get('default'), **alias)


def _fail(error: Exception | str) -> int:
  print(f'error: {error}', file=sys.stderr)
  return 1


def compilation_cache_dir(environ: typing.Mapping[str, str]) -> pathlib.Path:
  """Where the commands keep compiled programs: $JAXFORMER_CACHE_DIR, else
  $XDG_CACHE_HOME/jaxformer, else ~/.cache/jaxformer (the XDG default), in its folder 'xla'."""
  root = environ.get('JAXFORMER_CACHE_DIR') or pathlib.Path(
      environ.get('XDG_CACHE_HOME') or pathlib.Path.home() / '.cache') / 'jaxformer'
  return pathlib.Path(root) / 'xla'


def add_compilation_cache_flag(parser: argparse.ArgumentParser) -> None:
  """--no-compilation-cache, read by use_compilation_cache (every command and script has it)."""
  _flag(parser, 'no_compilation_cache', action='store_true',
        help='compile everything afresh, keeping nothing (default: compiled programs are kept '
        'in $JAXFORMER_CACHE_DIR/xla, by default ~/.cache/jaxformer/xla, and the next command '
        'loads them)')


def use_compilation_cache(args: argparse.Namespace) -> None:
  """The commands' compilation cache (compilation.enable_cache) in compilation_cache_dir, unless
  --no-compilation-cache, or jax's own JAX_COMPILATION_CACHE_DIR names a folder (then left as
  jax set it up)."""
  if args.no_compilation_cache:
    jax.config.update('jax_enable_compilation_cache', False)
  elif not jax.config.jax_compilation_cache_dir:
    compilation.enable_cache(compilation_cache_dir(os.environ))


def _setup_logging() -> None:
  logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s',
                      force=True)  # absl may have installed a handler already
  logging.getLogger('absl').setLevel(logging.WARNING)  # orbax logs every step at INFO


# --- train ----------------------------------------------------------------------------------------


def _setting_type(hint: Any):
  def parse(text: str) -> Any:
    try:
      return recipes.parse_value(hint, text)
    except ValueError as e:
      raise argparse.ArgumentTypeError(f'{e}, got {text!r}') from None
  parse.__name__ = 'value'
  return parse


# The sections whose every field is also a flag of `jaxformer train` (--num-steps for --set
# train.num_steps=...): the data section has its own few.
_SHORTCUTS = (('train', TrainConfig), ('optim', OptimConfig))
_SECTION_TITLES = {'train': 'training', 'optim': 'optimisation: the learning rate, Adam, clipping, '
                   'label smoothing'}


def _add_train_flags(parser: argparse.ArgumentParser) -> None:
  parser.add_argument('--config', default='auto',
                      help='auto: a recipe sized from the training corpus (--train-src, '
                      f'--train-tgt); a shipped recipe ({", ".join(recipes.NAMES)}); or a recipe '
                      '.py file')
  parser.add_argument('--workdir', required=True, type=path_arg, help='checkpoints, '
                      'vocabulary, token cache, logs; rerunning resumes from its newest '
                      'checkpoint')
  parser.add_argument('--variant', help="a Table 3 row (A1..A4, B1, B2, C1..C7, D1..D4, E, big): "
                      "the recipe's model becomes that variant of base")
  parser.add_argument('--set', dest='assignments', action='append', default=[],
                      metavar='SECTION.NAME=VALUE',
                      help='change any setting, e.g. --set model.dropout_rate=0.2 --set '
                      'train.num_steps=5000 --set model.vocab_size=8000 (repeatable; SECTION: '
                      'model, train, data, optim; a wrong name lists the valid ones)')
  group = parser.add_argument_group(
      'data (shortcuts for --set data.NAME=...)')
  _flag(group, 'source', choices=('wmt14', 'text', 'embedded'), help="default: the recipe's")
  for name, side in (('source_language', 'source'), ('target_language', 'target')):
    _flag(group, name, metavar='LANG', help=f'the {side} language (ISO 639: en, de, zh, ...); '
          "wmt14 reads en->de, de->en, en->fr or fr->en (default: the recipe's)")
  for name, help_text in (('train_src', 'training source file (text source)'),
                          ('train_tgt', 'training target file'),
                          ('eval_src', 'validation source file (optional)'),
                          ('eval_tgt', 'validation target file'),
                          ('tfds_data_dir', 'tfds data folder (default: $TFDS_DATA_DIR)')):
    _flag(group, name, type=path_arg, help=help_text)
  _flag(group, 'download', action='store_true', default=None,
        help='let tfds download and prepare WMT14 (needs internet; hours)')
  groups = {}
  for section, cls in _SHORTCUTS:
    group = groups[section] = parser.add_argument_group(
        f"{_SECTION_TITLES[section]} (shortcuts for --set {section}.NAME=...; defaults: the "
        "recipe's)")
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
      help_text = (f"{field.metadata['help']} (default: the recipe's; {cls.__name__}'s: "
                   f'{field.default})')
      if bool in (hints[field.name], *typing.get_args(hints[field.name])):
        _flag(group, field.name, action=argparse.BooleanOptionalAction, default=None,
              help=help_text)
      else:
        _flag(group, field.name, type=_setting_type(hints[field.name]),
              metavar=field.metadata['metavar'] or ('NAME' if hints[field.name] is str else 'N'),
              default=None, help=help_text)
  group = groups['train']
  _flag(group, 'allow_cpu', action='store_true',
        help="train the paper's recipes even on a CPU backend (= --no-require-accelerator)")
  group.add_argument('--remat', action='store_true',
                     help='recompute layer activations in the backward pass (= --set '
                     'model.execution.remat=true)')
  group = parser.add_argument_group('multi-host (jax.distributed)')
  group.add_argument('--distributed', action='store_true',
                     help='call jax.distributed.initialize (auto-detects on SLURM, TPU, ...)')
  _flag(group, 'coordinator_address', help='host:port of process 0')
  _flag(group, 'num_processes', type=positive_int, help='processes in the cluster')
  _flag(group, 'process_id', type=int, help="this process's index")


def recipe_of(args: argparse.Namespace) -> recipes.Recipe:
  """The recipe of `args`: --config and --variant, then the shortcut flags spelled as --set,
  then --set itself (which wins)."""
  auto = args.config == 'auto'
  if auto and args.variant:
    raise SettingError('--variant makes a Table 3 row of the base recipe: give --config base.')
  recipe = recipes.AUTO if auto else recipes.load(args.config, args.variant)
  shortcuts = [f'{section}.{field.name}={getattr(args, field.name)}'
               for section, cls in (('data', DataConfig), *_SHORTCUTS)
               for field in dataclasses.fields(cls) if getattr(args, field.name, None) is not None]
  shortcuts += ['train.require_accelerator=false'] * args.allow_cpu
  shortcuts += ['model.execution.remat=true'] * args.remat
  assignments = shortcuts + args.assignments
  recipe = recipes.override(recipe, assignments)
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
  if parent is None:
    return recipe
  # Fine-tuning: the parent's model, changed only where --set says so (the trainer checks that
  # only what check_fine_tune allows changed).
  model_sets = [a for a in assignments if a.strip().startswith('model.')]
  return recipes.override(dataclasses.replace(recipe, model=parent[0]), model_sets)


def _train(args: argparse.Namespace) -> int:
  _setup_logging()
  if args.distributed or args.coordinator_address:
    try:
      parallel.initialize(args.coordinator_address, args.num_processes, args.process_id)
    except (ValueError, RuntimeError) as e:  # jax's: no cluster found, or none answering
      raise SettingError(f'--distributed: cannot join a cluster ({str(e).splitlines()[0]}); '
                         'give --coordinator-address, --num-processes and --process-id, or run '
                         'under a launcher jax detects (SLURM, Cloud TPU, ...).') from None
  files.check_workdir(args.workdir)  # before the recipe's work, which may be minutes
  summary = trainer.train_recipe(recipe_of(args), args.workdir)
  print(json.dumps(summary, indent=2))
  if summary.get('signal') == 'SIGINT':  # saved; SIGTERM (a preemption) ends with 0
    print('interrupted', file=sys.stderr)
    return 130
  return 0


# --- loading a model ------------------------------------------------------------------------------


def _add_model_path(parser: argparse.ArgumentParser, *aliases: str) -> None:
  """--model PATH, the one name of "the model to load" in eval, translate and export; --workdir
  (and eval's --checkpoint) are older spellings of it, kept out of the help (older_spellings)."""
  parser.add_argument('--model', dest='model', type=path_arg, metavar='PATH',
                      help='the model: a training workdir (its newest checkpoint), a checkpoint '
                      'folder (e.g. WORKDIR/average-last5) or an exported folder')
  for alias in ('--workdir', *aliases):
    parser.add_argument(alias, dest='model', type=path_arg, help=argparse.SUPPRESS)


# The commands whose model flag is --model, and its older spellings there.
_MODEL_ALIASES = {'eval': ('--workdir', '--checkpoint'), 'translate': ('--workdir',),
                  'export': ('--workdir',)}


def older_spellings(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
  """A line for each older spelling in `argv` (a command's arguments): the underscore spelling
  of a flag (--num_steps) and the model's --workdir/--checkpoint, which still work."""
  if not argv or argv[0] not in _subcommands(parser):
    return []
  command = argv[0]
  hidden = {option for action in _subcommands(parser)[command]._actions  # pylint: disable=protected-access
            if action.help == argparse.SUPPRESS for option in action.option_strings}
  lines = []
  for word in argv[1:]:
    flag = word.split('=')[0]
    if flag in _MODEL_ALIASES.get(command, ()):
      lines.append(f'note: {flag} is an older spelling of --model; it still works.')
    elif flag in hidden and '_' in flag:
      lines.append(f'note: {flag} is an older spelling of {flag.replace("_", "-")}; it still '
                   'works.')
  return lines


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
  return parser._subparsers._group_actions[0].choices  # pylint: disable=protected-access


def _add_model_flags(parser: argparse.ArgumentParser, *, beam: bool = True) -> None:
  _flag(parser, 'average_last', type=positive_int,
        help="average a workdir's last N checkpoints first")
  if beam:
    parser.add_argument('--beam', type=positive_int, default=4, help='beam size (1: greedy)')
    parser.add_argument('--alpha', type=non_negative(float), default=0.6,
                        help='length penalty exponent')
    _flag(parser, 'extra_length', type=non_negative(int), default=50,
          help='max output = input + this')
    _flag(parser, 'batch_size', type=positive_int, default=32, help='sentences per batch')


def translator(path: str, args: argparse.Namespace) -> tuple[Translator, int]:
  """A Translator of a workdir, checkpoint folder or exported folder, and the model's step."""
  params, config, spm_model, step = export.load_model(path, args.average_last)
  tokenizer = data.Tokenizer.from_bytes(spm_model, f'the vocabulary of {path}')
  return Translator(params, config, tokenizer, beam_size=args.beam, alpha=args.alpha,
                    extra_length=args.extra_length, batch_size=args.batch_size), step


# --- eval -----------------------------------------------------------------------------------------


def _test_set(args: argparse.Namespace) -> tuple[data.ParallelText, str]:
  if args.src or args.ref:
    if not (args.src and args.ref):
      raise data.DataError('--src and --ref go together.')
    return data.read_parallel_text(args.src, args.ref), pathlib.Path(args.src).stem
  text = data.load_wmt14(args.target_language, 'test', source_language=args.source_language,
                         data_dir=args.tfds_data_dir)
  return text, f'newstest2014-{args.source_language}{args.target_language}'


def _eval(args: argparse.Namespace) -> int:
  logging.getLogger('absl').setLevel(logging.WARNING)
  scoring.check_language(args.target_language)  # before the model is loaded and run
  path = args.model
  model, step = translator(path, args)
  text, name = _test_set(args)
  output = pathlib.Path(args.output or pathlib.Path(path) / f'hyps-{name}.txt')
  if not output.parent.is_dir():  # found out before the translation, not after
    return _fail(f'{output.parent}: no such folder for the hypotheses.')
  try:
    hypotheses = model.translate(text.src, progress=True)
  except KeyboardInterrupt:
    print('interrupted: no hypotheses written', file=sys.stderr)
    return 130
  files.write_atomically(output, ''.join(h + '\n' for h in hypotheses).encode(),
                         'the hypotheses')
  if warning := scoring.undertrained(hypotheses, step):
    print(f'warning: {warning}', file=sys.stderr)
  result = scoring.scores(hypotheses, text.tgt, args.target_language)
  print('\n'.join(scoring.report(
      result, lang=args.target_language, origin=text.origin, segments=len(text),
      decoding=f'beam {args.beam}, alpha {args.alpha}, max length input + {args.extra_length}; '
      f'hypotheses in {output}')))
  print(json.dumps({**result, 'segments': len(text), 'hypotheses': str(output)}))
  return 0


# --- translate ------------------------------------------------------------------------------------


def _translate(args: argparse.Namespace) -> int:
  if args.nbest and args.nbest > args.beam:
    return _fail(f'--nbest {args.nbest} needs --beam >= {args.nbest}.')
  model = translator(args.model, args)[0]
  if args.input:  # a whole file, with a progress bar
    chunks = [data.read_lines(args.input)]
  else:  # a terminal: each line answered; a pipe: a batch for each of the translator's workers
    chunks = text_lib.chunks(sys.stdin.buffer, 'stdin',
                             1 if sys.stdin.isatty() else args.batch_size * model.workers)

  def translate(chunk: list[str]) -> list[Any]:
    progress = bool(args.input)
    return model.translate(chunk, progress) if args.nbest is None else \
        model.translate_nbest(chunk, args.nbest, progress)
  text_lib.write_translations(args.output, chunks, translate, args.nbest)
  return 0  # (input that is not UTF-8 stops at that line: a DataError)


def _serve(args: argparse.Namespace) -> int:
  _setup_logging()
  model, step = translator(args.model, args)
  serving.serve(model, args.host, args.port, info={'model': args.model, 'step': step})
  return 0


# --- export, average, params ----------------------------------------------------------------------


def _export(args: argparse.Namespace) -> int:
  if (args.model is None) == (args.path is None):
    return _fail('give the model to export once: jaxformer export --model PATH OUT.')
  path = args.model or args.path
  if args.path is not None:
    print('note: `jaxformer export PATH OUT` is an older spelling of `jaxformer export --model '
          'PATH OUT`; it still works.', file=sys.stderr)
  export.check_destination(args.out, args.format, args.overwrite)  # before the loading
  params, config, spm_model, step = export.load_model(path, args.average_last)
  if args.format == 'ctranslate2':
    out = export.save_ctranslate2(args.out, params, config, spm_model, overwrite=args.overwrite)
  else:
    out = export.save(args.out, params, config, spm_model, step=step, overwrite=args.overwrite)
  print(f'exported step {step} of {path} to {out} ({args.format})')
  return 0


def _average(args: argparse.Namespace) -> int:
  if args.best:
    out = checkpoint.save_average(args.workdir, best=args.best, metric=args.metric)
    print(f'averaged the {args.best} checkpoints with the best validation {args.metric} of '
          f'{args.workdir} into {out}')
  else:
    out = checkpoint.save_average(args.workdir, args.last)
    print(f'averaged the last {args.last} checkpoints of {args.workdir} into {out}')
  return 0


def _params(args: argparse.Namespace) -> int:
  cfg = getattr(config_lib, args.preset)(vocab_size=args.vocab_size)
  print(f'{args.preset} (vocab {args.vocab_size}): {parameter_count(cfg):,} parameters')
  return 0


# --- the parser -----------------------------------------------------------------------------------


_TRAIN_DESCRIPTION = (
    'Trains a Transformer; rerunning the same command resumes from the workdir. Without '
    '--config, the recipe is sized from the training files (printed, with the reasons, before '
    'training).\n\n'
    '  jaxformer train --workdir W --train-src train.es --train-tgt train.en \\\n'
    '      --eval-src val.es --eval-tgt val.en --source-language es --target-language en\n'
    '  jaxformer train --init-from W/average-last5 --workdir W2 --train-src new.es '
    '--train-tgt new.en\n'
    '  jaxformer train --config base --workdir workdirs/base --tfds-data-dir ~/tfds\n'
    '  jaxformer train --config demo --workdir W --set train.num_steps=20\n\n'
    'On a CPU, run it on huge pages as make does (glibc >= 2.35; faster, see '
    'docs/speed.md):\n\n'
    '  GLIBC_TUNABLES=glibc.malloc.hugetlb=1 jaxformer train ...')


def _add_eval_flags(parser: argparse.ArgumentParser) -> None:
  """eval's test set: newstest2014 from tfds, or local files, and the target language."""
  _flag(parser, 'target_language', metavar='LANG', default='de',
        help="the test set's target language (ISO 639: de, es, zh, ...): sacreBLEU's "
        'tokenizer (13a; zh; ja-mecab and ko-mecab with sacrebleu[ja], [ko]) and the Moses rules '
        'of the tokenized BLEU follow it')
  _flag(parser, 'source_language', metavar='LANG', default='en',
        help='with tfds: which newstest2014 direction (en->de, de->en, en->fr, fr->en)')
  _flag(parser, 'tfds_data_dir', help='tfds data folder (default: $TFDS_DATA_DIR)')
  parser.add_argument('--src', type=path_arg, help='a local source file instead of tfds')
  parser.add_argument('--ref', type=path_arg, help='its reference translations, line-aligned')
  parser.add_argument('--output', type=path_arg,
                          help='hypotheses file (default: next to the checkpoint)')


def _add_translate_flags(parser: argparse.ArgumentParser) -> None:
  _add_model_path(parser)
  _add_model_flags(parser)
  parser.add_argument('--input', type=path_arg, help='a UTF-8 text file (default: stdin)')
  parser.add_argument('--output', type=path_arg, help='where to write (default: stdout)')
  parser.add_argument('--nbest', type=positive_int, help='the N best translations with scores')
  parser.add_argument('--server', help='translate with a running `jaxformer serve` at this '
                      'address (e.g. http://127.0.0.1:8228) instead of --model: the model and '
                      'its decoding flags are the server\'s, and nothing is loaded or compiled')


_SERVE_DESCRIPTION = (
    'Loads the model, compiles its shortest search, and answers POST /translate with JSON '
    '{"src": [sentences], "nbest": N (optional)} until Ctrl-C: `jaxformer translate --server '
    'URL` (or any HTTP client) then pays neither imports nor compiling. For this machine only '
    'by default: the server has no authentication.')


def _add_serve_flags(parser: argparse.ArgumentParser) -> None:
  _add_model_path(parser)
  _add_model_flags(parser)
  parser.add_argument('--host', default='127.0.0.1',
                      help='the address to listen on (0.0.0.0: every network, unauthenticated)')
  parser.add_argument('--port', type=port_number, default=serving.DEFAULT_PORT,
                      help='the port (0: a free one, logged at start)')


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='jaxformer', formatter_class=_Formatter,
      description='A faithful JAX/Flax reproduction of "Attention Is All You Need".')
  commands = parser.add_subparsers(dest='command', metavar='COMMAND')

  def command(name: str, run, help_text: str, description: str = '') -> argparse.ArgumentParser:
    paragraphs = (description or help_text).split('\n\n')
    description = '\n\n'.join(p if p.startswith(' ') else textwrap.fill(p, 88)
                               for p in paragraphs)
    sub = commands.add_parser(name, help=help_text, description=description,
                              formatter_class=_Formatter)
    sub.set_defaults(run=run)
    add_compilation_cache_flag(sub)
    return sub

  _add_train_flags(command(
      'train', _train, f'train a recipe ({", ".join(recipes.NAMES)}) or a config file',
      _TRAIN_DESCRIPTION))

  evaluation = command(
      'eval', _eval, 'BLEU and chrF of a model on newstest2014 or your own files',
      'Translates a test set with the paper\'s decoding (beam 4, alpha 0.6, input + 50) and prints '
      'sacreBLEU (the headline, with its signature), the paper\'s tokenized BLEU and chrF; writes '
      'the hypotheses.')
  _add_model_path(evaluation, '--checkpoint')
  _add_model_flags(evaluation)
  _add_eval_flags(evaluation)

  translate = command(
      'translate', _translate, 'translate text (stdin, or --input) with beam 4, alpha 0.6',
      'One output line per input line. From a terminal each line is answered as it is typed; '
      'files and pipes are translated in batches. With --nbest N each input line gives N lines '
      '"INDEX ||| TRANSLATION ||| SCORE" (Moses n-best format: INDEX counts input lines from 0, '
      'SCORE is log-probability / GNMT length penalty, best first; blank lines give none).')
  _add_translate_flags(translate)

  _add_serve_flags(command(
      'serve', _serve, 'keep a model loaded and compiled, answering translations over HTTP',
      _SERVE_DESCRIPTION))

  export = command(
      'export', _export, 'a self-contained folder (config.json, spm.model, params.safetensors) '
      'or a CTranslate2 model',
      'Writes a model that Translator.from_pretrained(OUT) (and jaxformer eval/translate) load '
      'without orbax or the workdir; with --format ctranslate2, a CTranslate2 model of the same '
      "weights (pip install 'jaxformer[ctranslate2]'), with spm.model beside it.")
  _add_model_path(export)
  export.add_argument('path', nargs='?', type=path_arg,
                      help='the model, as --model (an older spelling)')
  export.add_argument('out', type=path_arg, help='the folder to write')
  export.add_argument('--format', choices=('jaxformer', 'ctranslate2'), default='jaxformer',
                      help='jaxformer: config.json + spm.model + safetensors; ctranslate2: a '
                      'CTranslate2 model directory')
  export.add_argument('--overwrite', action='store_true',
                      help='replace an export of the same format already in OUT (otherwise OUT '
                      'must be new or empty)')
  _add_model_flags(export, beam=False)

  average = command('average', _average, 'average the last N checkpoints of a workdir, or the N '
                    'best by validation metric, into a new checkpoint')
  average.add_argument('--workdir', required=True, type=path_arg, help='a training workdir')
  which = average.add_mutually_exclusive_group()
  which.add_argument('--last', type=positive_int, default=5,
                     help='how many of the newest (paper: 5 base, 20 big)')
  which.add_argument('--best', type=positive_int,
                     help='how many of the best by --metric instead (a run trained with '
                     '--set train.average_best=N recorded the metrics and kept them)')
  average.add_argument('--metric', choices=sorted(config_lib.BEST_METRICS), default='loss',
                       help='validation metric that ranks checkpoints for --best')

  params = command('params', _params, 'count the parameters of a preset')
  params.add_argument('--preset', choices=_PRESETS, default='base', help='the preset')
  _flag(params, 'vocab_size', type=positive_int, default=37000, help='shared vocabulary size')
  return parser


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if serving.is_client(argv):
    return serving.client_main(argv[1:])
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.command is None:
    parser.print_help()
    return 0
  if args.command in ('eval', 'translate', 'serve') and args.model is None:
    _subcommands(parser)[args.command].error('the following arguments are required: --model')
  for line in older_spellings(parser, argv):
    print(line, file=sys.stderr)

  def run() -> int:
    use_compilation_cache(args)
    with monitor.Interrupts():
      return args.run(args)
  return exit_code(run)


if __name__ == '__main__':
  sys.exit(main())
