"""jaxformer.batching: requests queued together searched together by key, each answered with its
own part, and errors kept to the requests they belong to (a model of plain Python here; the
server's tests run it with a Translator)."""

import threading

from jaxformer import batching, protocol
from jaxformer.errors import DataError
from jaxformer.settings import DecodingConfig

Translate, Score = protocol.TranslateRequest, protocol.ScoreRequest


class Echo:
  """A model that answers each sentence with itself (its prefix first), recording each search;
  a search says it began (`entered`) and waits for `release`, so that the requests after the
  first queue meanwhile."""

  decoding = DecodingConfig()

  def __init__(self):
    self.searches, self.entered, self.release = [], threading.Event(), threading.Event()

  def run(self, request):
    self.entered.set()
    assert self.release.wait(30)
    self.searches.append(request)
    if any(s == 'bad' for s in request.src):
      raise DataError('a bad sentence')
    if any(s == 'crash' for s in request.src):
      raise RuntimeError('a bug')
    prefixes = request.prefix or [''] * len(request.src)
    return [p + s for p, s in zip(prefixes, request.src)]


def _answers(requests, model=None):
  """Each request's future result (or its exception), all submitted while the first's search
  waits; the model's searches."""
  model = model or Echo()
  batcher = batching.Batcher(model, max_batch=100, batch_wait=0.0)
  try:
    futures = [batcher.submit(requests[0])]
    assert model.entered.wait(30)  # the first is being searched: the others queue behind it
    futures += [batcher.submit(r) for r in requests[1:]]
    model.release.set()
    return [f.exception(30) or f.result() for f in futures], model.searches
  finally:
    batcher.close()


def test_requests_of_one_key_are_one_search_and_each_gets_its_own_part():
  answers, searches = _answers([Translate(['first']), Translate(['a', 'b']),
                                Translate(['c'], prefix=['p-']), Translate(['d'], nbest=2),
                                Translate(['e'])])
  assert answers[:3] == [['first'], ['a', 'b'], ['p-c']] and answers[4] == ['e']
  # The first alone; then the translations of one search together, the n-best one apart.
  assert searches[0] == Translate(['first'])
  assert Translate(['a', 'b', 'c', 'e'], prefix=['', '', 'p-', '']) in searches
  assert Translate(['d'], nbest=2) in searches and len(searches) == 3


def test_a_sampling_request_is_searched_alone():
  sampled = {'sampling': True, 'seed': 1}
  _, searches = _answers([Translate(['first']), Translate(['a'], settings=sampled),
                          Translate(['b'], settings=sampled, first_index=9)])
  assert len(searches) == 3  # its keys follow its own first_index
  assert batching.key_of(Translate(['a'], settings=sampled), DecodingConfig()) != \
      batching.key_of(Translate(['a'], settings=sampled), DecodingConfig())
  assert batching.key_of(Translate(['a']), DecodingConfig()) == batching.key_of(
      Translate(['b', 'c']), DecodingConfig())
  assert batching.key_of(Score(['a'], ['b']), DecodingConfig()).kind is Score


def test_a_bad_request_gets_its_error_and_the_others_their_answers():
  answers, _ = _answers([Translate(['first']), Translate(['a']), Translate(['bad']),
                         Translate(['c'])])
  assert answers[1] == ['a'] and answers[3] == ['c']
  assert isinstance(answers[2], DataError)


def test_a_bug_fails_every_request_of_its_search():
  answers, _ = _answers([Translate(['first']), Translate(['a']), Translate(['crash'])])
  assert answers[0] == ['first']
  assert all(isinstance(a, RuntimeError) and str(a) == 'a bug' for a in answers[1:])


def test_a_search_that_loses_an_answer_fails_its_requests_instead_of_shifting_them():
  class Short(Echo):
    def run(self, request):
      return super().run(request)[1:]
  answers, _ = _answers([Translate(['first']), Translate(['a']), Translate(['b'])], Short())
  assert all(isinstance(a, RuntimeError) for a in answers)
  assert str(answers[1]) == 'the search of 2 sentences gave 1 answers'


def test_close_answers_what_was_queued_first():
  model = Echo()
  model.release.set()
  batcher = batching.Batcher(model, max_batch=2, batch_wait=0.0)
  futures = [batcher.submit(Translate([str(i)])) for i in range(5)]
  batcher.close()
  assert [f.result(0) for f in futures] == [[str(i)] for i in range(5)]
  assert all(len(s.src) <= 2 for s in model.searches)  # max_batch sentences a search at most
