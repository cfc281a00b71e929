"""Data: sources (tfds WMT14, text files, the generated embedded corpus, any in-memory pairs),
the shared sentencepiece vocabulary, the token cache, packed resumable batches, and the one
entry point that turns a run's pairs into its batches (pipeline.sources, pipeline.build)."""

from jaxformer.data import embedded, pipeline, tokenizer
from jaxformer.data.cache import TokenizedCorpus, tokenize_corpus
from jaxformer.data.packing import (PackedBatches, pack_rows, padding_efficiency, row_lengths,
                                    rows_per_device)
from jaxformer.data.sources import (DataError, PairSource, ParallelText, TextFiles, TfdsSplit,
                                    load_tfds, load_wmt14, read_parallel_text, wmt14)
from jaxformer.data.tokenizer import (EOS_ID, PAD_ID, UNK_ID, SidedTokenizer, Tokenizer,
                                      train_tokenizer)
from jaxformer.text import decode_line, read_lines

__all__ = ['DataError', 'EOS_ID', 'PAD_ID', 'PackedBatches', 'PairSource', 'ParallelText',
           'SidedTokenizer', 'TextFiles', 'TfdsSplit', 'TokenizedCorpus', 'Tokenizer', 'UNK_ID',
           'decode_line', 'embedded', 'load_tfds', 'load_wmt14', 'pack_rows', 'padding_efficiency',
           'pipeline', 'read_lines', 'read_parallel_text', 'row_lengths', 'rows_per_device',
           'tokenize_corpus', 'tokenizer', 'train_tokenizer', 'wmt14']
