"""Data: sources (tfds WMT14, text files, the generated embedded corpus, any in-memory pairs),
the shared sentencepiece vocabulary, the token cache, and packed, resumable batches."""

from jaxformer.data import embedded
from jaxformer.data.cache import TokenizedCorpus, tokenize_corpus
from jaxformer.data.packing import (PackedBatches, pack_rows, padding_efficiency, row_lengths,
                                    rows_per_device)
from jaxformer.data.sources import (DataError, ParallelText, decode_line, load_tfds,
                                    load_wmt14, read_lines, read_parallel_text)
from jaxformer.data.tokenizer import EOS_ID, PAD_ID, UNK_ID, Tokenizer, train_tokenizer

__all__ = ['DataError', 'EOS_ID', 'PAD_ID', 'PackedBatches', 'ParallelText', 'TokenizedCorpus',
           'Tokenizer', 'UNK_ID', 'decode_line', 'embedded', 'load_tfds', 'load_wmt14',
           'pack_rows', 'padding_efficiency', 'read_lines', 'read_parallel_text', 'row_lengths',
           'rows_per_device', 'tokenize_corpus', 'train_tokenizer']
