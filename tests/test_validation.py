"""jaxformer.validation: a run's sample translations and its undertrained warning, through
trainer.train as a run evaluates (its metrics and BLEU: conftest's `trained` fixture)."""

from helpers import CFG, TEXT, synthetic_text
from helpers import train_settings as _tc

from jaxformer import trainer, translation


def test_each_evaluation_writes_sample_translations_to_tensorboard(trained):
  from tensorboard.backend.event_processing import event_accumulator  # noqa  (slow import)
  events = event_accumulator.EventAccumulator(str(trained / 'tensorboard'),
                                              size_guidance={'tensors': 0})
  events.Reload()
  (samples,) = events.Tensors('samples')  # one evaluation, at the last step
  table = samples.tensor_proto.string_val[0].decode().splitlines()
  assert samples.step == 6 and table[:2] == ['| source | hypothesis | reference |', '|---|---|---|']
  text = synthetic_text(50, seed=9)
  translator = translation.Translator.from_checkpoint(str(trained / 'checkpoints'))
  hypotheses = translator.translate(text.src[:3])
  assert table[2:] == [f'| {s} | {h} | {r} |' for s, h, r in
                       zip(text.src, hypotheses, text.tgt)]


def test_validation_says_when_the_model_is_undertrained(tmp_path, caplog, monkeypatch):
  """A model whose validation translations are all empty (as an undertrained one's often are):
  the evaluation says it is undertrained, with its step."""
  monkeypatch.setattr(translation.Translator, 'translate', lambda self, s, **k: [''] * len(s))
  with caplog.at_level('WARNING'):
    trainer.train(CFG, _tc(num_steps=2, eval_every_steps=2, bleu_sentences=8), tmp_path, TEXT,
                  synthetic_text(20, seed=9))
  warnings = [m for m in caplog.messages if m.startswith('validation at step 2: ')]
  assert len(warnings) == 1 and 'the model is undertrained after 2 steps' in warnings[0]
