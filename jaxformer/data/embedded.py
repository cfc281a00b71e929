"""The embedded EN->DE corpus: sentence pairs generated from a small hand-written grammar.

It ships with the code, so the demo runs offline. The grammar makes a model need what attention
gives: German verb-second after a fronted adverb, verb-final subordinate and relative clauses,
separable verbs, article and adjective endings by gender, number and case (nominative,
accusative, dative after prepositions), negation (nicht / kein), plurals and numbers.

Splits: every sentence containing one of HELD_OUT's (adjective, noun) pairs goes to `test`, so
the test split asks for combinations of known words never seen together in training
(compositional generalisation); the rest is split into `train` and `validation`. No sentence
is in two splits, and the same seed gives the same corpus.
"""

import dataclasses

import numpy as np

from jaxformer.data.sources import ParallelText

# --- lexicon ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Noun:
  """A noun of the lexicon: English and German forms, gender, and whether it names a person."""
  en: str
  en_plural: str
  gender: str  # m, f, n
  de: str
  de_plural: str
  person: bool = False

  def de_form(self, plural: bool, case: str) -> str:
    """The German form in a number and case ('nom', 'acc', 'dat')."""
    if not plural:
      return self.de
    # Dative plural adds -n unless the plural already ends in -n or -s.
    if case == 'dat' and not self.de_plural.endswith(('n', 's')):
      return self.de_plural + 'n'
    return self.de_plural


NOUNS = [
    Noun('man', 'men', 'm', 'Mann', 'Männer', person=True),
    Noun('woman', 'women', 'f', 'Frau', 'Frauen', person=True),
    Noun('child', 'children', 'n', 'Kind', 'Kinder', person=True),
    Noun('teacher', 'teachers', 'm', 'Lehrer', 'Lehrer', person=True),
    Noun('girl', 'girls', 'n', 'Mädchen', 'Mädchen', person=True),
    Noun('friend', 'friends', 'm', 'Freund', 'Freunde', person=True),
    Noun('doctor', 'doctors', 'm', 'Arzt', 'Ärzte', person=True),
    Noun('dog', 'dogs', 'm', 'Hund', 'Hunde'),
    Noun('cat', 'cats', 'f', 'Katze', 'Katzen'),
    Noun('bird', 'birds', 'm', 'Vogel', 'Vögel'),
    Noun('book', 'books', 'n', 'Buch', 'Bücher'),
    Noun('car', 'cars', 'n', 'Auto', 'Autos'),
    Noun('table', 'tables', 'm', 'Tisch', 'Tische'),
    Noun('house', 'houses', 'n', 'Haus', 'Häuser'),
    Noun('garden', 'gardens', 'm', 'Garten', 'Gärten'),
    Noun('flower', 'flowers', 'f', 'Blume', 'Blumen'),
    Noun('letter', 'letters', 'm', 'Brief', 'Briefe'),
    Noun('apple', 'apples', 'm', 'Apfel', 'Äpfel'),
    Noun('door', 'doors', 'f', 'Tür', 'Türen'),
    Noun('city', 'cities', 'f', 'Stadt', 'Städte'),
]
ADJECTIVES = [('big', 'groß'), ('small', 'klein'), ('old', 'alt'), ('young', 'jung'),
              ('red', 'rot'), ('new', 'neu'), ('green', 'grün'), ('quiet', 'still')]


@dataclasses.dataclass(frozen=True)
class Verb:
  """A verb of the lexicon, with its separable prefix if it has one."""
  en: str          # base form: "see", "pick up"
  en_3sg: str      # "sees", "picks up"
  de_3sg: str      # "sieht", "holt" (without a separable prefix)
  de_plural: str   # "sehen", "holen"
  prefix: str = ''  # separable prefix: "ab" in "holt ... ab", "abholt" at the end of a clause
  transitive: bool = True

  def de_finite(self, plural: bool) -> str:
    """The German present-tense form for a third-person subject."""
    return self.de_plural if plural else self.de_3sg


VERBS = [
    Verb('see', 'sees', 'sieht', 'sehen'),
    Verb('buy', 'buys', 'kauft', 'kaufen'),
    Verb('find', 'finds', 'findet', 'finden'),
    Verb('visit', 'visits', 'besucht', 'besuchen'),
    Verb('paint', 'paints', 'malt', 'malen'),
    Verb('call', 'calls', 'ruft', 'rufen', prefix='an'),
    Verb('pick up', 'picks up', 'holt', 'holen', prefix='ab'),
    Verb('tidy up', 'tidies up', 'räumt', 'räumen', prefix='auf'),
    Verb('sleep', 'sleeps', 'schläft', 'schlafen', transitive=False),
    Verb('laugh', 'laughs', 'lacht', 'lachen', transitive=False),
    Verb('wait', 'waits', 'wartet', 'warten', transitive=False),
    Verb('arrive', 'arrives', 'kommt', 'kommen', prefix='an', transitive=False),
]
PREPOSITIONS = [('with', 'mit'), ('next to', 'neben'), ('behind', 'hinter'),
                ('under', 'unter'), ('in front of', 'vor')]  # all with the dative here
ADVERBS = [('today', 'heute'), ('tomorrow', 'morgen'), ('now', 'jetzt'), ('often', 'oft')]
CONJUNCTIONS = [('because', 'weil'), ('although', 'obwohl'), ('when', 'wenn')]
NUMBERS = [('two', 'zwei'), ('three', 'drei'), ('four', 'vier'), ('five', 'fünf'),
           ('six', 'sechs'), ('seven', 'sieben')]

# (adjective, noun) pairs seen only in the test split.
HELD_OUT = {('red', 'dog'), ('old', 'car'), ('small', 'teacher'), ('green', 'book'),
            ('young', 'cat'), ('new', 'garden'), ('quiet', 'girl'), ('big', 'flower')}

# Articles by (kind, case) and gender / plural ('p').
_DEFINITE = {'nom': {'m': 'der', 'f': 'die', 'n': 'das', 'p': 'die'},
             'acc': {'m': 'den', 'f': 'die', 'n': 'das', 'p': 'die'},
             'dat': {'m': 'dem', 'f': 'der', 'n': 'dem', 'p': 'den'}}
_INDEFINITE = {'nom': {'m': 'ein', 'f': 'eine', 'n': 'ein'},
               'acc': {'m': 'einen', 'f': 'eine', 'n': 'ein'},
               'dat': {'m': 'einem', 'f': 'einer', 'n': 'einem'}}
# Adjective endings after der-words (weak), ein/kein (mixed) and no article (strong, plural).
_WEAK = {'nom': {'m': 'e', 'f': 'e', 'n': 'e', 'p': 'en'},
         'acc': {'m': 'en', 'f': 'e', 'n': 'e', 'p': 'en'},
         'dat': {'m': 'en', 'f': 'en', 'n': 'en', 'p': 'en'}}
_MIXED = {'nom': {'m': 'er', 'f': 'e', 'n': 'es', 'p': 'en'},
          'acc': {'m': 'en', 'f': 'e', 'n': 'es', 'p': 'en'},
          'dat': {'m': 'en', 'f': 'en', 'n': 'en', 'p': 'en'}}
_STRONG_PLURAL = {'nom': 'e', 'acc': 'e', 'dat': 'en'}


# --- phrases ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NounPhrase:
  """A determiner, an optional adjective and a noun, in one number."""
  noun: Noun
  determiner: str          # 'the', 'a', 'no' (kein), or a number word
  adjective: tuple[str, str] | None
  plural: bool

  def en(self) -> str:
    """The English phrase."""
    first = (self.adjective or (self.noun.en,))[0]
    words = [('an' if first[0] in 'aeiou' else 'a') if self.determiner == 'a'
             else self.determiner]
    if self.adjective:
      words.append(self.adjective[0])
    words.append(self.noun.en_plural if self.plural else self.noun.en)
    return ' '.join(words)

  def de(self, case: str) -> str:
    """The German phrase in a case, with the article and the adjective's ending it takes."""
    key = 'p' if self.plural else self.noun.gender
    if self.determiner == 'the':
      article, ending = _DEFINITE[case][key], _WEAK[case][key]
    elif self.determiner == 'no':  # kein: ein with a k (singular only here)
      article, ending = 'k' + _INDEFINITE[case][key], _MIXED[case][key]
    elif self.determiner == 'a':
      article, ending = _INDEFINITE[case][key], _MIXED[case][key]
    else:  # a number: no article, strong plural endings
      article, ending = dict(NUMBERS)[self.determiner], _STRONG_PLURAL[case]
    words = [article]
    if self.adjective:
      words.append(self.adjective[1] + ending)
    words.append(self.noun.de_form(self.plural, case))
    return ' '.join(words)


@dataclasses.dataclass(frozen=True)
class Clause:
  """Subject, verb, optional object and prepositional phrase, optional negation."""
  subject: NounPhrase
  verb: Verb
  obj: NounPhrase | None
  pp: tuple[tuple[str, str], NounPhrase] | None
  negated: bool

  def en(self) -> str:
    """The English clause."""
    plural = self.subject.plural
    if self.negated:
      verb = ('do not ' if plural else 'does not ') + self.verb.en
    else:
      verb = self.verb.en if plural else self.verb.en_3sg
    words = [self.subject.en(), verb]
    if self.obj:
      words.append(self.obj.en())
    if self.pp:
      words += [self.pp[0][0], self.pp[1].en()]
    return ' '.join(words)

  def _de_parts(self) -> tuple[list[str], str, str]:
    """(middle field, finite verb, separable prefix) in main-clause order."""
    middle = []
    # "kein" negates an indefinite object; otherwise "nicht" follows the object.
    object_takes_kein = self.negated and self.obj and self.obj.determiner == 'a'
    if self.obj:
      obj = dataclasses.replace(self.obj, determiner='no') if object_takes_kein else self.obj
      middle.append(obj.de('acc'))
    if self.negated and not object_takes_kein:
      middle.append('nicht')
    if self.pp:
      middle += [self.pp[0][1], self.pp[1].de('dat')]
    return middle, self.verb.de_finite(self.subject.plural), self.verb.prefix

  def de_main(self, fronted: str | None = None) -> str:
    """Verb second; the separable prefix goes to the end."""
    middle, finite, prefix = self._de_parts()
    head = [fronted, finite, self.subject.de('nom')] if fronted else [
        self.subject.de('nom'), finite]
    return ' '.join(head + middle + ([prefix] if prefix else []))

  def de_subordinate(self) -> str:
    """Verb last, with the separable prefix joined to it."""
    middle, finite, prefix = self._de_parts()
    return ' '.join([self.subject.de('nom')] + middle + [prefix + finite])


# --- sentences ----------------------------------------------------------------------------------


def _capitalise(text: str) -> str:
  return text[0].upper() + text[1:]


class Grammar:
  """Draws random sentence pairs from the grammar."""

  def __init__(self, rng: np.random.Generator):
    self.rng = rng

  def _pick(self, items):
    return items[self.rng.integers(len(items))]

  def noun_phrase(self, allow_no_article: bool = True) -> NounPhrase:
    """A random noun phrase (without a number word when `allow_no_article` is False)."""
    noun = self._pick(NOUNS)
    roll = self.rng.random()
    if roll < 0.45:
      determiner, plural = 'the', bool(self.rng.random() < 0.3)
    elif roll < 0.8 or not allow_no_article:
      determiner, plural = 'a', False
    else:
      determiner, plural = self._pick(NUMBERS)[0], True
    adjective = self._pick(ADJECTIVES) if self.rng.random() < 0.5 else None
    return NounPhrase(noun, determiner, adjective, plural)

  def clause(self) -> Clause:
    """A random clause."""
    verb = self._pick(VERBS)
    obj = self.noun_phrase() if verb.transitive else None
    pp = (self._pick(PREPOSITIONS), self.noun_phrase()) if self.rng.random() < 0.35 else None
    return Clause(self.noun_phrase(), verb, obj, pp, negated=bool(self.rng.random() < 0.25))

  def relative(self, head: NounPhrase) -> tuple[str, str]:
    """A relative clause on `head`: subject ("who sees the dog") or object ("that the dog
    sees") relative, verb last in German, pronoun by the head's gender and number."""
    key = 'p' if head.plural else head.noun.gender
    verb = self._pick([v for v in VERBS if v.transitive])
    other = self.noun_phrase()
    pronoun_en = 'who' if head.noun.person else 'that'
    if self.rng.random() < 0.5:  # the head is the relative clause's subject
      en = f'{pronoun_en} {verb.en if head.plural else verb.en_3sg} {other.en()}'
      de = f'{_DEFINITE["nom"][key]} {other.de("acc")} {verb.prefix}{verb.de_finite(head.plural)}'
    else:  # the head is its object
      plural = other.plural
      en = f'{pronoun_en} {other.en()} {verb.en if plural else verb.en_3sg}'
      de = f'{_DEFINITE["acc"][key]} {other.de("nom")} {verb.prefix}{verb.de_finite(plural)}'
    return en, de

  def sentence(self) -> tuple[str, str]:
    """A random (English, German) sentence pair."""
    kind = self.rng.random()
    main = self.clause()
    if kind < 0.3:  # plain main clause
      en, de = main.en(), main.de_main()
    elif kind < 0.5:  # fronted adverb: verb second
      adverb = self._pick(ADVERBS)
      en, de = f'{adverb[0]} {main.en()}', main.de_main(fronted=adverb[1])
    elif kind < 0.8:  # main clause + subordinate clause: verb last
      conjunction, sub = self._pick(CONJUNCTIONS), self.clause()
      en = f'{main.en()} {conjunction[0]} {sub.en()}'
      de = f'{main.de_main()}, {conjunction[1]} {sub.de_subordinate()}'
    else:  # relative clause on the subject
      rel_en, rel_de = self.relative(main.subject)
      subject_en = main.subject.en()
      en_rest = main.en()[len(subject_en):]
      de_main = main.de_main()
      subject_de = main.subject.de('nom')
      en = f'{subject_en} {rel_en}{en_rest}'
      de = f'{subject_de}, {rel_de},{de_main[len(subject_de):]}'
    return _capitalise(en) + '.', _capitalise(de) + '.'


def _held_out(english: str) -> bool:
  words = english.lower().split()
  nouns = {n.en: n.en for n in NOUNS} | {n.en_plural: n.en for n in NOUNS}
  return any((a, nouns.get(b)) in HELD_OUT for a, b in zip(words, words[1:]))


def generate(num_pairs: int, seed: int = 0) -> list[tuple[str, str]]:
  """num_pairs distinct (English, German) pairs, drawn with this seed."""
  grammar, pairs, seen = Grammar(np.random.default_rng(seed)), [], set()
  attempts = 0
  while len(pairs) < num_pairs:
    attempts += 1
    if attempts > 20 * num_pairs + 1000:
      raise ValueError(f'the grammar yields fewer than {num_pairs} distinct pairs')
    pair = grammar.sentence()
    if pair[0] not in seen:
      seen.add(pair[0])
      pairs.append(pair)
  return pairs


def splits(num_train: int = 60_000, num_validation: int = 1000, num_test: int = 1000,
           seed: int = 0) -> dict[str, ParallelText]:
  """train / validation / test ParallelTexts with no shared sentence; test holds the sentences
  with a HELD_OUT (adjective, noun) pair (and only those), train and validation none."""
  grammar, seen = Grammar(np.random.default_rng(seed)), set()
  buckets: dict[str, list[tuple[str, str]]] = {'train': [], 'validation': [], 'test': []}
  wanted = {'train': num_train, 'validation': num_validation, 'test': num_test}
  attempts = 0
  while any(len(buckets[k]) < wanted[k] for k in buckets):
    attempts += 1
    if attempts > 50 * sum(wanted.values()) + 1000:
      raise ValueError('the grammar yields too few distinct pairs for these split sizes')
    en, de = grammar.sentence()
    if en in seen:
      continue
    if _held_out(en):
      split = 'test'
    elif len(buckets['validation']) < wanted['validation'] and (
        attempts % 20 == 0 or len(buckets['train']) >= wanted['train']):
      split = 'validation'
    else:
      split = 'train'
    if len(buckets[split]) < wanted[split]:
      seen.add(en)
      buckets[split].append((en, de))
  return {name: ParallelText([en for en, _ in pairs], [de for _, de in pairs],
                             origin=f'embedded-{name}-seed{seed}')
          for name, pairs in buckets.items()}
