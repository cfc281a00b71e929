"""The `jaxformer` command line: train, eval, translate, export, average, params.

Thin wrappers around library functions. Flags are spelled with dashes (`--num-steps`); older
spellings (`--num_steps`, `eval --workdir`) still work and print a note (older_spellings). Every
model, training and data setting can be changed with `--set SECTION.NAME=VALUE` (SECTION: model,
train, data, optim).
"""

import argparse
import dataclasses
import logging
import os
import pathlib
import sys
import textwrap
import typing
from typing import Any

import jax

from jaxformer import arguments, client, commands, compilation, formats, monitor, recipes
from jaxformer.arguments import (add_model_flags, add_model_path, flag, path_arg, port_number,
                                 positive_int)
from jaxformer import config as config_lib
from jaxformer.settings import ServerLimits
from jaxformer.errors import exit_code


_PRESETS = ('tiny', 'base', 'big')  # what `jaxformer params` counts
_LONG = ('train', 'serve')  # the commands whose log shows jaxformer's INFO records


def compilation_cache_dir(environ: typing.Mapping[str, str]) -> pathlib.Path:
  """Where the commands keep compiled programs: $JAXFORMER_CACHE_DIR, else
  $XDG_CACHE_HOME/jaxformer, else ~/.cache/jaxformer (the XDG default), in its folder 'xla'."""
  root = environ.get('JAXFORMER_CACHE_DIR') or pathlib.Path(
      environ.get('XDG_CACHE_HOME') or pathlib.Path.home() / '.cache') / 'jaxformer'
  return pathlib.Path(root) / 'xla'


def add_compilation_cache_flag(parser: argparse.ArgumentParser) -> None:
  """--no-compilation-cache, read by use_compilation_cache (every command and script has it)."""
  flag(parser, 'no_compilation_cache', action='store_true',
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


# --- train ----------------------------------------------------------------------------------------


def _setting_type(hint: Any):
  def parse(text: str) -> Any:
    try:
      return recipes.parse_value(hint, text)
    except ValueError as e:
      raise argparse.ArgumentTypeError(f'{e}, got {text!r}') from None
  parse.__name__ = 'value'
  return parse


_SECTION_TITLES = {'data': 'data', 'train': 'training',
                   'optim': 'optimisation: the learning rate, Adam, clipping, label smoothing'}


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
  groups = {}
  for section, cls in commands.SHORTCUTS:
    group = groups[section] = parser.add_argument_group(
        f"{_SECTION_TITLES[section]} (shortcuts for --set {section}.NAME=...; defaults: the "
        "recipe's)")
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
      help_text = (f"{field.metadata['help']} (default: the recipe's; {cls.__name__}'s: "
                   f'{field.default})')
      if bool in (hints[field.name], *typing.get_args(hints[field.name])):
        flag(group, field.name, action=argparse.BooleanOptionalAction, default=None,
              help=help_text)
      else:
        flag(group, field.name, type=_setting_type(hints[field.name]),
              metavar=field.metadata['metavar'] or ('NAME' if hints[field.name] is str else 'N'),
              default=None, help=help_text)
  group = groups['train']
  flag(group, 'allow_cpu', action='store_true',
        help="train the paper's recipes even on a CPU backend (= --no-require-accelerator)")
  group.add_argument('--remat', action='store_true',
                     help='recompute layer activations in the backward pass (= --set '
                     'model.execution.remat=true)')
  group = parser.add_argument_group('multi-host (jax.distributed)')
  group.add_argument('--distributed', action='store_true',
                     help='call jax.distributed.initialize (auto-detects on SLURM, TPU, ...)')
  flag(group, 'coordinator_address', metavar='HOST:PORT', help='the address of process 0')
  flag(group, 'num_processes', type=positive_int, metavar='N', help='processes in the cluster')
  flag(group, 'process_id', type=int, metavar='N', help="this process's index (from 0)")


# --- loading a model ------------------------------------------------------------------------------


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


# --- eval -----------------------------------------------------------------------------------------


# --- translate ------------------------------------------------------------------------------------


# --- score ----------------------------------------------------------------------------------------


_SCORE_DESCRIPTION = (
    'For each pair of --src and --tgt (line-aligned), the model\'s log-probability of the target '
    'given the source (forced decoding): natural log, summed over the target\'s sentencepiece '
    'pieces and its EOS (tokens = pieces + 1), and its mean per token. One output line per '
    'input line, in order: JSON lines {"log_prob", "tokens", "mean"} (with '
    '--token-log-probs, each token\'s too), or --format tsv: LOG_PROB TOKENS MEAN [TOKEN '
    'LOG-PROBS]. A pair longer than the model\'s max_len is not scored but marked (null in '
    'JSON with "skipped": why; nan in TSV), never dropped. translate --nbest prints these '
    'scores divided by ((5 + tokens) / 6)^alpha.\n\n'
    '  jaxformer score --model W/average-last5 --src test.en --tgt hyps.de > scores.jsonl')


def _add_score_flags(parser: argparse.ArgumentParser) -> None:
  add_model_path(parser)
  add_model_flags(parser, decoding=False)
  arguments.add_decoding_flags(parser, ('batch_size',))
  parser.add_argument('--src', type=path_arg, required=True, metavar='FILE',
                      help='the sources, a line each')
  parser.add_argument('--tgt', type=path_arg, required=True, metavar='FILE',
                      help='their translations to score, line-aligned')
  parser.add_argument('--output', type=arguments.stream_arg, metavar='FILE',
                      help='where to write (default, or -: stdout)')
  parser.add_argument('--format', choices=('jsonl', 'tsv'), default='jsonl',
                      help='JSON lines or tab-separated values')
  flag(parser, 'token_log_probs', action='store_true',
       help="also each token's log-probability (its pieces', then EOS's)")


# --- export, average, params ----------------------------------------------------------------------


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
  flag(parser, 'target_language', metavar='LANG',
        help="the test set's target language (ISO 639: de, es, zh, ...): sacreBLEU's "
        'tokenizer (13a; zh; ja-mecab and ko-mecab with sacrebleu[ja], [ko]) and the Moses rules '
        "of the tokenized BLEU follow it (default: the one the model's training run recorded, "
        "else de)")
  flag(parser, 'source_language', metavar='LANG', default='en',
        help='with tfds: which newstest2014 direction (en->de, de->en, en->fr, fr->en)')
  flag(parser, 'tfds_data_dir', metavar='DIR', help='tfds data folder (default: $TFDS_DATA_DIR)')
  parser.add_argument('--src', type=path_arg, metavar='FILE',
                      help='a local source file instead of tfds')
  parser.add_argument('--ref', type=path_arg, metavar='FILE',
                      help='its reference translations, line-aligned')
  parser.add_argument('--output', type=path_arg, metavar='FILE',
                          help='write the hypotheses to this file (default: none; eval only '
                          'reads the model)')


_SERVE_DESCRIPTION = (
    'Loads the model, compiles its shortest search, and answers POST /translate and POST '
    '/score with JSON (the evaluation guide has the protocol) until Ctrl-C or SIGTERM, which '
    'let the requests in flight finish (--drain-timeout): `jaxformer translate --server URL` '
    '(or any HTTP client) then pays neither imports nor compiling. Requests that arrive while a '
    'search runs are searched together next. GET /health answers 200 once the model is ready. '
    'Every wait, size and pool is bounded (the flags below), each limit answered with a status '
    'and a one-line JSON error. Listens on 127.0.0.1 by default; with an API key '
    '($JAXFORMER_API_KEY or --api-key-file) every request but /health needs "Authorization: '
    'Bearer KEY", and another address needs a key or --allow-no-key.')


def _add_serve_flags(parser: argparse.ArgumentParser) -> None:
  add_model_path(parser)
  add_model_flags(parser)
  group = parser.add_argument_group('address and access')
  group.add_argument('--host', default='127.0.0.1',
                     help='the address to listen on (0.0.0.0: every network; needs a key or '
                     '--allow-no-key)')
  group.add_argument('--port', type=port_number, default=client.DEFAULT_PORT,
                     help='the port (0: a free one, logged at start)')
  flag(group, 'api_key_file', type=path_arg, metavar='FILE',
       help='a file whose first line is the API key every request must send (default: '
       '$JAXFORMER_API_KEY, if set; none: no key)')
  flag(group, 'allow_no_key', action='store_true',
       help='serve an address other than loopback without a key: anyone who reaches the port '
       'can use the server')
  arguments.add_setting_flags(parser.add_argument_group('limits'), ServerLimits)


def _add_params_flags(parser: argparse.ArgumentParser) -> None:
  parser.add_argument('--preset', choices=_PRESETS, help='the preset (default: base)')
  flag(parser, 'vocab_size', type=positive_int, metavar='N',
       help="the preset's shared vocabulary size (default: 37000)")
  add_model_path(parser)  # (instead of a preset: that model's count)


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='jaxformer', formatter_class=arguments.Formatter,
      description='A faithful JAX/Flax reproduction of "Attention Is All You Need".')
  subparsers = parser.add_subparsers(dest='command', metavar='COMMAND')

  def command(name: str, help_text: str, description: str = '') -> argparse.ArgumentParser:
    """The parser of command `name`, which runs commands.NAME_command."""
    paragraphs = (description or help_text).split('\n\n')
    description = '\n\n'.join(p if p.startswith(' ') else textwrap.fill(p, 88)
                               for p in paragraphs)
    sub = subparsers.add_parser(name, help=help_text, description=description,
                                formatter_class=arguments.Formatter)
    sub.set_defaults(run=getattr(commands, f'{name}_command'))
    add_compilation_cache_flag(sub)
    return sub

  _add_train_flags(command(
      'train', 'train on your own files (a recipe sized from them), a recipe '
      f'({", ".join(recipes.NAMES)}) or a recipe file',
      _TRAIN_DESCRIPTION))

  evaluation = command(
      'eval', 'BLEU and chrF of a model on newstest2014 or your own files',
      'Translates a test set with the paper\'s decoding (beam 4, alpha 0.6, input + 50) and prints '
      'sacreBLEU (the headline, with its signature), the paper\'s tokenized BLEU and chrF; with '
      '--output, writes the hypotheses.')
  add_model_path(evaluation, '--checkpoint')
  add_model_flags(evaluation)
  _add_eval_flags(evaluation)

  translate = command(
      'translate', 'translate text (stdin, or --input) with beam 4, alpha 0.6',
      'One output line per input line, each as soon as it arrives; lines that come together are '
      'translated in batches. With --nbest N each input line gives N lines "INDEX ||| TRANSLATION '
      '||| SCORE" (Moses n-best: INDEX counts input lines from 0, SCORE is log-probability / GNMT '
      'length penalty, best first; blank lines give none).')
  arguments.add_translate_flags(translate)

  _add_score_flags(command(
      'score', "the model's log-probability of given translations",
      _SCORE_DESCRIPTION))

  _add_serve_flags(command(
      'serve', 'keep a model loaded and compiled, answering translations over HTTP',
      _SERVE_DESCRIPTION))

  export = command(
      'export', 'the model as a self-contained folder: jaxformer\'s own, CTranslate2 '
      'or Hugging Face',
      'Writes a model that Translator.from_pretrained(OUT) (and jaxformer eval/translate) load '
      'without orbax or the workdir; with --format, the same weights in another format.')
  add_model_path(export)
  export.add_argument('path', nargs='?', type=path_arg,
                      help='the model, as --model (an older spelling)')
  export.add_argument('out', type=path_arg, help='the folder to write')
  export.add_argument('--format', choices=sorted(formats.REGISTRY), default='jaxformer',
                      help='; '.join(f'{name}: {f.summary}' for name, f in
                                     formats.REGISTRY.items()))
  export.add_argument('--overwrite', action='store_true',
                      help='replace an export of the same format already in OUT (otherwise OUT '
                      'must be new or empty)')
  add_model_flags(export, decoding=False)

  average = command('average', 'average the last N checkpoints of a workdir, or the N '
                    'best by validation metric, into a new checkpoint')
  average.add_argument('--workdir', required=True, type=path_arg, help='a training workdir')
  which = average.add_mutually_exclusive_group()
  which.add_argument('--last', type=positive_int, default=5, metavar='N',
                     help='how many of the newest (paper: 5 base, 20 big)')
  which.add_argument('--best', type=positive_int, metavar='N',
                     help='how many of the best by --metric instead (a run trained with '
                     '--set train.average_best=N recorded the metrics and kept them)')
  average.add_argument('--metric', choices=sorted(config_lib.BEST_METRICS),
                       help='validation metric that ranks checkpoints for --best (default: loss)')

  _add_params_flags(command('params', 'count the parameters of a preset or of a model'))
  return parser


def main(argv: list[str] | None = None) -> int:
  """The `jaxformer` command: `translate --server` goes to the client (client.client_main, as
  jaxformer.__main__ sends it without importing jax), every other command is `run`; an error
  leaves it one way, errors.exit_code's line and status."""
  argv = sys.argv[1:] if argv is None else argv
  if client.is_client(argv):
    return client.client_main(argv[1:])
  return exit_code(lambda: run(argv))


def run(argv: list[str]) -> int:
  """Every command but `translate --server`, parsed and run; what goes wrong is raised (a
  JaxformerError, KeyboardInterrupt), for `main` to report."""
  parser = build_parser()
  args, unknown = parser.parse_known_args(argv)
  if unknown:  # (parse_args would show the usage of `jaxformer`, not the command's)
    (parser if args.command is None else _subcommands(parser)[args.command]).error(
        f'unrecognized arguments: {" ".join(unknown)}')
  if args.command is None:
    parser.print_help()
    return 0
  if args.command in ('eval', 'translate', 'serve', 'score') and args.model is None:
    _subcommands(parser)[args.command].error('the following arguments are required: --model')
  for line in older_spellings(parser, argv):
    print(line, file=sys.stderr)
  commands.setup_logging(level=logging.INFO if args.command in _LONG else logging.WARNING)
  use_compilation_cache(args)
  with monitor.Interrupts(), compilation.one_line_cache_errors():
    return args.run(args)


if __name__ == '__main__':
  sys.exit(main())
