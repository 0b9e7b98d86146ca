"""Which quantization plugin a run uses: ``--quantization``, else the checkpoint's ``quantization_config``; a
method no installed plugin provides, or a flag that contradicts the checkpoint, is one sentence."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from frame.config import EngineConfig
from frame.engine.selection import declared_quantization, select_quantization
from frame.errors import ConfigError
from frame.model_source import default_model_path
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry


@pytest.fixture(scope="module")
def hooks() -> PluginHooks:
    return PluginHooks(PluginRegistry())


def _source(path: Path, quantization_config: object = None) -> SimpleNamespace:
    hf_config = SimpleNamespace(quantization_config=quantization_config) if quantization_config else SimpleNamespace()
    return SimpleNamespace(path=path, hf_config=hf_config, is_gguf=path.is_file() and path.suffix == ".gguf")


def test_the_declared_method_is_read_from_a_dict_or_an_object() -> None:
    assert declared_quantization(SimpleNamespace()) is None
    assert declared_quantization(SimpleNamespace(quantization_config={"quant_method": "awq"})) == "awq"
    assert declared_quantization(SimpleNamespace(quantization_config=SimpleNamespace(quant_method="gptq"))) == "gptq"


def test_a_method_no_plugin_provides_is_one_sentence(hooks: PluginHooks, tmp_path: Path) -> None:
    config = EngineConfig(model=str(tmp_path))
    with pytest.raises(ConfigError, match=r"names quantization method 'awq' .* installed: .*int8"):
        select_quantization(hooks, config, _source(tmp_path, {"quant_method": "awq", "bits": 4}))


def test_a_flag_that_contradicts_the_checkpoint_is_refused(hooks: PluginHooks, tmp_path: Path) -> None:
    config = EngineConfig(model=str(tmp_path), quantization="gguf")
    with pytest.raises(ConfigError, match="drop the flag or pass --quantization int8"):
        select_quantization(hooks, config, _source(tmp_path, {"quant_method": "int8"}))


def test_dense_unless_asked(hooks: PluginHooks, tmp_path: Path) -> None:
    assert select_quantization(hooks, EngineConfig(model=str(tmp_path)), _source(tmp_path)) is None
    with pytest.raises(ConfigError, match="without quantization"):
        select_quantization(hooks, EngineConfig(model=str(tmp_path), quantization_options={"a": 1}), _source(tmp_path))


def test_the_flag_picks_a_method_that_checks_the_checkpoint(hooks: PluginHooks, tmp_path: Path) -> None:
    gguf = default_model_path()
    method = select_quantization(hooks, EngineConfig(model=str(gguf), quantization="gguf"), _source(gguf))
    assert method is not None and method.name == "gguf"
    with pytest.raises(ConfigError, match="--quantization gguf cannot serve"):
        select_quantization(hooks, EngineConfig(model=str(tmp_path), quantization="gguf"), _source(tmp_path))
