"""The export formats, each one module behind one small interface (`Format`): what it writes,
what files.describe calls its folder, and which models it cannot express. `jaxformer export
--format`'s choices and help come from REGISTRY; a new format is a module here and its entry
below (and, if its folder needs telling apart, its marker file in files.EXPORT_MARKERS)."""

import dataclasses
import pathlib
from collections.abc import Callable
from jaxformer import files
from jaxformer.config import TransformerConfig
from jaxformer.formats import ctranslate2, huggingface, native


@dataclasses.dataclass(frozen=True)
class Format:
  """One export format."""
  name: str          # --format's value
  kind: files.Kind   # what files.describe calls a folder of it
  summary: str       # its line in --format's help
  cannot: Callable[[TransformerConfig], str | None]  # the setting it cannot express, or None
  save: Callable[..., pathlib.Path]  # save(out, params, config, spm_model, *, step, overwrite,
                                     #      **format's own options) -> out


REGISTRY = {f.name: f for f in (
    Format('jaxformer', files.EXPORT, "jaxformer's own: config.json + spm.model + safetensors "
           '(Translator.from_pretrained and every command load it)', native.cannot, native.save),
    Format('ctranslate2', files.CTRANSLATE2, "a CTranslate2 model (pip install "
           "'jaxformer[ctranslate2]'), spm.model beside it", ctranslate2.cannot, ctranslate2.save),
    Format('huggingface', files.HUGGINGFACE, "Hugging Face transformers' MarianMT "
           '(MarianMTModel and MarianTokenizer load it), with a model card', huggingface.cannot,
           huggingface.save))}
