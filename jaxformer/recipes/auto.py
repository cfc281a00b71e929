"""The automatic recipe: `jaxformer train` without --config (or with --config auto) sizes the
vocabulary, the model, dropout, the lengths, the schedule and the checkpoints from the corpus
it is given and the backend, and says why in one block before training.

The rules are anchored on two measured points and calibrated below the first on subsets of
Multi30k (docs/own-data.md, "What the automatic recipe chooses"; the runs are in
docs/BENCHMARKS.md). At Multi30k's size (29k pairs) they give the `multi30k` recipe (on a GPU,
`multi30k_gpu`'s wider model), whose every choice was ablated on Multi30k's validation set;
from PAPER_PAIRS pairs on (WMT14 EN-DE has 4.5M) they give the paper's base recipe. Below 29k
pairs the vocabulary shrinks and dropout and the number of epochs grow, as the low-resource
literature found (Araabi & Monz, COLING 2020); runs on 4,000 pairs set the warmup's floor
and the growth of the epochs.
"""

import dataclasses
import functools
import json
import math
import pathlib
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxformer import config as config_lib
from jaxformer import files
from jaxformer.config import OptimConfig, TransformerConfig
from jaxformer.data import sources, tokenizer as tokenizer_lib
from jaxformer.recipes import Recipe, override

PAPER_PAIRS = 1_000_000  # from here on: the paper's base recipe (Table 3 "base", §5)
REFERENCE_PAIRS = 29_000  # Multi30k's training set: the multi30k recipe's point
SMALL_PAIRS = 10_000      # below this, dropout 0.3 (docs/own-data.md has the runs)
MEASURED_PAIRS = 2_000    # the fewest the rules were measured on: below, the epochs stop growing
MIN_PAIRS = 100           # below this, no recipe: too few pairs to learn a translation from
MIN_STEPS = 300           # the fewest updates the recipe trains (a warmup needs room to act)
TOKENS_PER_BATCH = 8192   # the multi30k recipes'
LONG_SHARE = 0.999        # max_len covers this share of the sentences,
OUTLIERS = 5              # but leaves out at least this many of the longest (a small corpus's
                          # 99.9th percentile is its longest line, however long)
PROBE_SENTENCES = 20_000  # sentences the lengths are measured on (all of a small corpus)
# The multi30k (CPU) and multi30k_gpu recipes' warmups: the highest peaks of the paper's lrate
# measured stable for their models.
MIN_WARMUP = {'cpu': 400, 'gpu': 800}
FINE_TUNE_LR_SCALE = 0.25  # of the paper's learning rate, for --init-from (docs/finetuning.md)


@dataclasses.dataclass(frozen=True)
class Corpus:
  """What the rules read of a corpus: its size and its lengths in vocabulary pieces."""
  pairs: int
  mean_pieces: float     # per sentence, both sides, without EOS (lengths_of: all but the
  long_pieces: int       # longest); the most pieces of a sentence with its EOS
  largest_vocab: int | None  # the most pieces sentencepiece can make of it (None: more than
                             # the rule asks for)
  long_share: float = LONG_SHARE  # the share of the sentences within long_pieces


def lengths_of(lengths: Sequence[int]) -> tuple[float, int, float]:
  """The mean pieces of a sentence (without EOS), the most (with it), and the share of the
  sentences within that most, all once the longest are left out: 1 - LONG_SHARE of them, but at
  least OUTLIERS (at most a tenth), so that a handful of overlong lines, which the data pipeline
  drops and counts, sets neither max_len nor the epochs' size."""
  ordered = sorted(lengths)
  left_out = min(max(math.ceil(round((1 - LONG_SHARE) * len(ordered), 9)), OUTLIERS),
                 len(ordered) // 10)
  kept = ordered[:len(ordered) - left_out] or [0]
  return float(np.mean(kept)), kept[-1] + 1, len(kept) / max(1, len(ordered))


@dataclasses.dataclass(frozen=True)
class Choice:
  """What the rules chose for a corpus, and the reason for each choice (a line each)."""
  model: TransformerConfig
  train: dict[str, Any]  # the TrainConfig fields the rules set (the recipe's others stay)
  optim: OptimConfig
  reasons: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Sizing:
  """The recipe the rules chose, and why: what was sized (or that a record was resumed), a
  line per choice of the rules, and the user's settings over them (--set, the data's aside)."""
  recipe: Recipe
  head: str
  rules: tuple[str, ...]
  settings: tuple[str, ...]

  @property
  def reasons(self) -> tuple[str, ...]:
    """Every line, as the command prints them: the last is the user's settings, or how to give
    some."""
    return (self.head, *self.rules,
            f'then your settings, which win: {", ".join(self.settings)}' if self.settings else
            'change any of it with --set SECTION.NAME=VALUE (or its flag); docs/own-data.md '
            'explains the rules')


def rule_vocab_size(pairs: int) -> int:
  """8000 pieces at Multi30k's size (the multi30k recipe's), growing as the square root of the
  pairs (smaller vocabularies for smaller corpora), in steps of 500, 1000 at least; the paper's
  37000 from PAPER_PAIRS on."""
  if pairs >= PAPER_PAIRS:
    return 37_000
  return int(min(37_000, max(1000, 500 * round(16 * math.sqrt(pairs / REFERENCE_PAIRS)))))


def rule_epochs(pairs: int) -> float:
  """Passes over the data: the multi30k recipe's 33 at 29k pairs, more for fewer pairs (as
  the ratio to the power 0.4), fewer for more: where the validation loss of a small corpus
  stopped falling (docs/BENCHMARKS.md, "Your own data")."""
  return 33.0 * (REFERENCE_PAIRS / pairs) ** 0.4


def measure(pairs: sources.PairSource, vocab_size: int, *, seed: int = 0,
            tokenizer: tokenizer_lib.Tokenizer | None = None) -> Corpus:
  """The corpus's size and its lengths in the pieces of a probe vocabulary of `vocab_size`,
  trained on up to PROBE_SENTENCES sentences (or of `tokenizer`, a fine-tuning run's)."""
  sample = list(tokenizer_lib.sample(pairs, PROBE_SENTENCES, seed))
  largest = None
  if tokenizer is None:
    with tempfile.TemporaryDirectory() as folder:
      probe = functools.partial(tokenizer_lib.train_tokenizer, sample,
                                pathlib.Path(folder) / 'probe.model', seed=seed,
                                what="probe vocabulary (to measure the sentences' lengths)")
      try:
        tokenizer = probe(vocab_size)
      except tokenizer_lib.VocabularyTooLarge as e:
        largest = e.largest
        tokenizer = probe(largest)
  mean, long, share = lengths_of([len(ids) for ids in tokenizer.encode(sample)])
  return Corpus(pairs=len(pairs), mean_pieces=mean, long_pieces=long, largest_vocab=largest,
                long_share=share)


def _round_up(x: float, step: int) -> int:
  return int(step * math.ceil(x / step))


def _check_pairs(pairs: int) -> None:
  if pairs < MIN_PAIRS:
    raise config_lib.SettingError(
        f'{pairs:,} training pairs are too few to learn a translation from: the automatic recipe '
        f'needs at least {MIN_PAIRS} (its rules were measured from {MEASURED_PAIRS:,}). To train '
        'on them anyway, a check of the pipeline say, give a recipe and the steps: --config '
        'multi30k --num-steps 20.')


def choose(corpus: Corpus, backend: str, parent: TransformerConfig | None = None, *,
           peak_given: bool = False) -> Choice:
  """The recipe's settings for `corpus` on `backend` ('cpu' or 'gpu'), and the reason for each
  choice. A fine-tuning run (`parent`: the model it starts from) keeps the parent's model and
  trains at FINE_TUNE_LR_SCALE of the paper's learning rate, unless the user gives a peak
  learning rate of their own (`peak_given`), which is then used as it is. A SettingError below
  MIN_PAIRS pairs."""
  pairs = corpus.pairs
  _check_pairs(pairs)
  if pairs >= PAPER_PAIRS and parent is None:  # the paper's base recipe (recipes/base.py)
    return Choice(config_lib.base(37_000),
                  {'num_steps': 100_000, 'tokens_per_batch': 25_000, 'average_last': 5,
                   'checkpoint_every_secs': 600.0}, OptimConfig(),
                  (f'{pairs:,} pairs: at least {PAPER_PAIRS:,}, the paper\'s base recipe (§5, '
                   'Table 3): N=6, d_model 512, 37k pieces, 100k steps of 25k tokens, '
                   'checkpoints every 10 minutes, the last 5 averaged',))
  model, reasons = _model(corpus, backend) if parent is None else (parent, [
      f'model        the parent\'s (N={parent.num_layers}, d_model {parent.d_model}, '
      f'{parent.vocab_size:,} pieces, dropout {parent.dropout_rate}): fine-tuning keeps it'])
  # Rows of 64 tokens are the shortest the recipes pack (a row's attention costs the same
  # whatever max_len is below it), so max_len is at least that. A fine-tuning run keeps its
  # parent's max_len, what the model translates (an OPUS-MT model's 511), and raises it for
  # longer sentences unless the parent learned a table of max_len positions; its rows are sized
  # for the new sentences all the same, since attention over long rows slows every step
  # (docs/benchmarks-log.md), and the pairs longer than a row are dropped and counted.
  needed = min(256, max(64, _round_up(corpus.long_pieces, 8)))
  max_len = needed if parent is None else (
      parent.max_len if parent.learned_positions else max(parent.max_len, needed))
  row_len = max(64, _round_up(min(max_len, needed), 32))
  whose = ''
  if max_len != needed:  # (the parent's)
    whose = (" (max_len the parent's learned positions')" if parent.learned_positions else
             " (max_len the parent's: what the model translates)")
  cut = corpus.long_pieces > needed  # (at 256: the longest the recipe makes room for)
  reasons.append(f'lengths      max_len {max_len}, rows of {row_len}: '
                 f'{corpus.long_share:.1%} of the sentences have at most {corpus.long_pieces} '
                 f'pieces with EOS{whose}{" (cut to 256)" if cut else ""}; longer pairs are '
                 'dropped and counted')
  if pairs < MEASURED_PAIRS:
    reasons.insert(0, f'corpus       {pairs:,} pairs: fewer than {MEASURED_PAIRS:,}, the fewest '
                   'the rules were measured on; ' + (
                       'a corpus this small cannot teach a translation model, and the epochs '
                       f'stop growing at those of {MEASURED_PAIRS:,} pairs' if parent is None
                       else f'the epochs stop growing at those of {MEASURED_PAIRS:,} pairs'))
  gpu = backend == 'gpu'
  steps, warmup, why = _schedule(corpus, gpu and parent is None)
  reasons.append(why)
  optim = {'warmup_steps': warmup}
  if parent is not None and not peak_given:
    optim['lr_scale'] = FINE_TUNE_LR_SCALE
    reasons.append(f'learning rate {FINE_TUNE_LR_SCALE} of the paper\'s formula (lr_scale): '
                   'fine-tuning moves a trained model less than a fresh run')
  every = max(10, _round_up(steps / 18, 10))
  # A validation pass (its loss, and the sample translations) is a noticeable share of a small
  # run on a CPU, where it then comes at every other checkpoint (docs/BENCHMARKS.md).
  evaluate = every if gpu else 2 * every
  # Only the averaged checkpoints come by the step count: a save written in the background slows
  # the steps beside it (docs/BENCHMARKS.md), and before them one every 10 minutes is enough
  # to resume from.
  reasons.append(f'checkpoints  the last 5 every {every} steps, averaged (before them one every '
                 f'10 minutes, to resume from); a validation pass every {evaluate} steps and at '
                 'the end, when there is a validation set')
  train = {'num_steps': steps, 'tokens_per_batch': TOKENS_PER_BATCH, 'row_len': row_len,
           'checkpoint_every_steps': every, 'checkpoint_steps_to_average': True,
           'checkpoint_every_secs': 600.0, 'keep_checkpoints': 5, 'average_last': 5,
           'eval_every_steps': evaluate, 'log_every_steps': max(10, every // 2)}
  return Choice(model.replace(max_len=max_len), train, OptimConfig(**optim), tuple(reasons))


def _schedule(corpus: Corpus, twice: bool) -> tuple[int, int, str]:
  """The steps and the warmup (`twice`: a fresh run on a GPU, its epochs doubled), and the
  reason line, which says where a floor rather than a rule set them."""
  epochs = rule_epochs(max(corpus.pairs, MEASURED_PAIRS)) * (2 if twice else 1)
  epoch_tokens = corpus.pairs * (corpus.mean_pieces + 1)  # target tokens a pass, with EOS
  rule = epochs * epoch_tokens / TOKENS_PER_BATCH
  steps = max(MIN_STEPS, 50 * round(rule / 50))
  # 22% of the steps, but never a higher peak learning rate than the anchor recipe's: a shorter
  # warmup made the small model diverge on a small corpus (docs/BENCHMARKS.md).
  least = MIN_WARMUP['gpu' if twice else 'cpu']
  warmup = max(least, _round_up(0.22 * steps, 10))
  why_steps = (f'the fewest the recipe trains; the rule\'s {epochs:,.0f} epochs would be '
               f'{max(1, round(rule))} steps' if steps == MIN_STEPS and rule < MIN_STEPS - 25 else
               '33 at 29k pairs, growing as (29k / pairs)^0.4'
               + (f' down to {MEASURED_PAIRS:,} pairs' if corpus.pairs < MEASURED_PAIRS else '')
               + ('; twice that on a GPU' if twice else ''))
  why_warmup = (f"the multi30k recipe's {least} at least, longer than the run: the learning "
                'rate rises throughout and never peaks' if warmup >= steps else
                f"at least the multi30k recipe's {least}: a shorter one peaks higher "
                '(docs/own-data.md)' if warmup == least else
                "22% of the steps, as the multi30k recipe's 400 of 1800")
  return steps, warmup, (f'schedule     {steps:,} steps of {TOKENS_PER_BATCH:,} tokens, about '
                         f'{steps * TOKENS_PER_BATCH / epoch_tokens:,.0f} epochs of '
                         f'{epoch_tokens:,.0f} target tokens ({why_steps}); warmup {warmup} '
                         f'({why_warmup})')


def _model(corpus: Corpus, backend: str) -> tuple[TransformerConfig, list[str]]:
  """The vocabulary, model and dropout a fresh run's corpus is given, and why."""
  pairs = corpus.pairs
  vocab = rule_vocab_size(pairs)
  reasons = [f'vocabulary   {vocab:,} pieces: 8000 at 29k pairs (the multi30k recipe), as the '
             'square root of the pairs']
  if corpus.largest_vocab is not None and corpus.largest_vocab < vocab:
    vocab = corpus.largest_vocab
    reasons[0] = (f'vocabulary   {vocab:,} pieces: the most sentencepiece can make of this text '
                  f'(the rule asks for {rule_vocab_size(pairs):,})')
  gpu = backend == 'gpu'
  dims = dict(num_layers=4, d_model=256, d_ff=1024, num_heads=4) if gpu else \
      dict(num_layers=4, d_model=128, d_ff=256, num_heads=4)
  dropout = 0.3 if gpu or pairs < SMALL_PAIRS else 0.2
  reasons.append(f'model        N=4, d_model {dims["d_model"]}, d_ff {dims["d_ff"]}, h 4: '
                 f'{"multi30k_gpu" if gpu else "multi30k"} recipe\'s (a small model for a small '
                 f'corpus; the paper\'s base only from {PAPER_PAIRS:,} pairs)')
  reasons.append(f'dropout      {dropout}: ' + (
      "multi30k_gpu's, for the wider model" if gpu else
      f'{"fewer than" if pairs < SMALL_PAIRS else "at least"} {SMALL_PAIRS:,} pairs'))
  return TransformerConfig(vocab_size=vocab, dropout_rate=dropout, **dims), reasons


def size(recipe: Recipe, assignments: Sequence[str], *, backend: str,
         parent: tuple[TransformerConfig, tokenizer_lib.Tokenizer] | None = None) -> Sizing:
  """`recipe` (its data section: a text source) with the model, training and optimisation
  settings chosen for its training corpus, then `assignments` (--set) applied over them; for a
  fine-tuning run, `parent` is the model's config and vocabulary."""
  if recipe.data.source != 'text' or not recipe.data.train_src:
    raise config_lib.SettingError('the automatic recipe sizes itself from your corpus: give '
                                  '--train-src and --train-tgt (or a --config).')
  pairs = sources.TextFiles(recipe.data.train_src, recipe.data.train_tgt)
  _check_pairs(len(pairs))  # (before the probe vocabulary is trained on them)
  if recipe.data.eval_src:  # read now, as a given recipe's run reads it: wrong files found first
    sources.read_parallel_text(recipe.data.eval_src, recipe.data.eval_tgt)
  corpus = measure(pairs, rule_vocab_size(len(pairs)), seed=recipe.train.seed,
                   tokenizer=parent and parent[1])
  given = {a.partition('=')[0].strip() for a in assignments}
  chosen = choose(corpus, backend, parent and parent[0],
                  peak_given='optim.learning_rate' in given)
  train = dataclasses.replace(recipe.train, **chosen.train)
  sized = Recipe(chosen.model, train, recipe.data, chosen.optim)
  head = (f'the automatic recipe for {corpus.pairs:,} pairs ({corpus.mean_pieces:.1f} pieces a '
          f'sentence, {corpus.long_share:.1%} within {corpus.long_pieces}) on {backend}:')
  return Sizing(override(sized, assignments), head, chosen.reasons, _settings(assignments))


def _settings(assignments: Sequence[str]) -> tuple[str, ...]:
  return tuple(a for a in assignments if not a.startswith('data.'))


def recorded(workdir: str | pathlib.Path, recipe: Recipe, assignments: Sequence[str]
             ) -> Sizing | None:
  """The recipe `record` wrote in `workdir`, when the workdir has checkpoints to resume, with
  `recipe`'s data section and `assignments` (--set) applied over it: a resumed run keeps the
  choices its checkpoints were trained with (the corpus is not measured again, and a newer
  jaxformer's rules do not change them). None for a fresh workdir or one without a record."""
  workdir = pathlib.Path(workdir)
  path = workdir / 'recipe.json'
  if not path.is_file() or not files.has_checkpoints(workdir):
    return None
  fields, where = files.read_record(path, 'the recipe record'), str(path)
  record = {name: files.field(fields, name, dict, where) for name in ('train', 'model', 'optim')}
  # (a record from before 'rules' has them between its first and last reasons)
  rules = files.field(fields, 'rules', list, where, None) or files.field(
      fields, 'reasons', list, where)[1:-1]
  try:
    known = {f.name for f in dataclasses.fields(config_lib.TrainConfig)}
    train = config_lib.TrainConfig(**{k: v for k, v in record['train'].items() if k in known})
    sized = Recipe(config_lib.config_from_dict(record['model']), train, recipe.data,
                   config_lib.optim_from_dict(record['optim']))
    rules = tuple(str(rule) for rule in rules)
  except (ValueError, TypeError) as e:
    raise config_lib.SettingError(f'{path}: damaged recipe record ({type(e).__name__}: {e}); '
                                  'give the settings with --config, or remove it.') from None
  head = f'resuming: the automatic recipe recorded in {path} (the corpus is not measured again)'
  return Sizing(override(sized, assignments), head, rules, _settings(assignments))


def record(workdir: str | pathlib.Path, sizing: Sizing) -> pathlib.Path:
  """Writes the choices and their reasons to WORKDIR/recipe.json (beside the checkpoints,
  which record the model and optimiser settings as for any recipe)."""
  recipe = sizing.recipe
  path = pathlib.Path(workdir) / 'recipe.json'
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise files.cannot_write(path, 'the recipe', e) from None
  files.write_atomically(path, (json.dumps({
      'recipe': 'auto', 'reasons': list(sizing.reasons), 'rules': list(sizing.rules),
      'settings': list(sizing.settings),
      'model': config_lib.config_to_dict(recipe.model),
      'train': dataclasses.asdict(recipe.train), 'optim': dataclasses.asdict(recipe.optim),
      'data': recipe.data.in_use()}, indent=1) + '\n').encode(), 'the recipe')
  return path

