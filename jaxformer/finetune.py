"""Fine-tuning (`--init-from`): a fresh run that starts from another model's params and
vocabulary: which workdirs may take one, what the run inherits, and how well the inherited
vocabulary covers the new data (it cannot change, so a poor fit is said before training).
"""

import logging
import pathlib
from typing import Any

from jaxformer import export, files
from jaxformer import data as data_lib
from jaxformer.config import SettingError, TransformerConfig, check_fine_tune
from jaxformer.data import tokenizer as tokenizer_lib

log = logging.getLogger(__name__)


def check_fine_tune_workdir(workdir: str | pathlib.Path, init_from: str | None) -> None:
  """A fine-tuning run (`init_from`) into a workdir that already holds checkpoints resumes it
  only when that run fine-tunes the same parent, as its vocabulary record says; anything else
  would silently continue another run under this command, so it is a SettingError saying what
  the workdir holds and what to do. So is a parent inside the workdir itself."""
  if not init_from:
    return
  workdir, parent = pathlib.Path(workdir).resolve(), pathlib.Path(init_from).resolve()
  if parent == workdir or workdir in parent.parents:
    raise SettingError(f'--init-from {init_from} is the workdir {workdir} or lies in it: '
                       'fine-tune into a new --workdir (to continue this run, leave out '
                       '--init-from).')
  if not files.has_checkpoints(workdir):
    return
  record = tokenizer_lib.record_near(workdir) or {}
  origin = record.get('inherited_from')  # (a record from before 'parent': its path as given)
  recorded = record.get('parent') or str(origin).partition(' (step ')[0]
  if origin and pathlib.Path(recorded).resolve() == parent:
    log.info('resuming %s, whose run already starts from %s', workdir, init_from)
    return
  holds = f'a fine-tuning run of {origin}' if origin else 'a run trained from scratch'
  raise SettingError(f'{workdir} already holds {holds}: --init-from {init_from} would continue '
                     f'that run, not start from {init_from}. Fine-tune into a new --workdir, or '
                     'leave out --init-from to resume it.')


def inherit(path: str, config: TransformerConfig, workdir: pathlib.Path,
            pairs: data_lib.PairSource) -> Any:
  """The params of the model at `path` (any kind export.load_model reads), checked to be of
  `config`'s model (check_fine_tune). Its vocabulary is written into `workdir` as spm.model,
  recorded as inherited, so that the run tokenises with it and never trains one; how well it
  covers `pairs` is logged first (report_coverage)."""
  params, parent_config, spm_model, step = export.load_model(path)
  check_fine_tune(parent_config, config, path)
  origin = f'{path} (step {step})'
  coverage = report_coverage(data_lib.Tokenizer.from_bytes(spm_model, f'the vocabulary of {path}'),
                             pairs, tokenizer_lib.record_near(path))
  tokenizer_lib.inherit_vocabulary(spm_model, workdir / 'spm.model', origin, coverage,
                                   parent=str(pathlib.Path(path).resolve()))
  log.info('fine-tuning %s: its params and vocabulary, a fresh optimiser and schedule', origin)
  return params


# Above this share of characters spelled in byte pieces, the inherited vocabulary does not know
# the new text's script or alphabet well (a vocabulary trained on that text has none: every
# character it sees is a piece of its own).
FALLBACK_WARNING = 0.005


def report_coverage(tokenizer: data_lib.Tokenizer, pairs: data_lib.PairSource,
                    record: dict[str, Any] | None, sample: int = tokenizer_lib.COVERAGE_SAMPLE
                    ) -> dict[str, float]:
  """Logs in one line how well an inherited vocabulary covers the first `sample` sentences of the
  new data, beside its coverage of its own data where its record has it; a warning when more
  than FALLBACK_WARNING of the characters fall back to bytes or unk, or the words take over
  1.5 times the pieces they took in the parent's data."""
  now = tokenizer.coverage(tokenizer_lib.first_sentences(pairs, sample))
  before = (record or {}).get('coverage')
  line = (f'the inherited vocabulary on the new data: {now["fallback_share"]:.2%} of characters '
          f'in byte pieces or unk, {now["pieces_per_word"]:.2f} pieces per word')
  if before:
    line += (f' (its own data: {before["fallback_share"]:.2%}, '
             f'{before["pieces_per_word"]:.2f})')
  poor = now['fallback_share'] > FALLBACK_WARNING or (
      before and now['pieces_per_word'] > 1.5 * before['pieces_per_word'])
  if poor:
    log.warning('%s: it fits the new text poorly, and fine-tuning cannot change it; a model '
                'trained with a vocabulary of its own may do better.', line)
  else:
    log.info(line)
  return now
