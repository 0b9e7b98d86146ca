"""Conformance suite for quantization plugins: subclass :class:`QuantizationConformance`.

A subclass names its plugin (``plugin_name``) and may override ``checkpoint`` (a fixture: the path of a checkpoint
the method serves). By default that is a tiny random Llama with dense float32 weights (:func:`dense_checkpoint`),
so every weight the method packs is judged against the dense weights it came from: a method whose weights are far
from them (one that returns zeros) fails. A method that reads packed weights from a format of its own (the ``gguf``
plugin) passes a checkpoint of that format instead. The suite checks the method's contract: it is created through
its hook, declares every packed format it uses that is not one of frame's own (:class:`PackedFormat`: layout,
reference class), accepts the checkpoint, every weight it packs has the dense weight's shape, dequantises to what
the checkpoint holds (exactly for weights read packed, within ``rtol`` of the largest dense value for weights it
quantizes), follows the row operations that loading applies (row slices, a row order, concatenation), and a model
loaded through it (``model_family`` on the ``cpu`` platform with ``sdpa``, float32) gives logits that correlate
with the dense model's. The platform's kernels serve the packed layers where it has them, so the last check covers
them too.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
import torch

from frame.interfaces.quantization import FORMATS, PackedWeight, QuantizationMethod
from frame.layers import attach_platform_kernels, finish_loading
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.weights import open_weights

#: Prompt of the model check: ids well inside any vocabulary.
PROMPT = [1, 504, 3458, 282, 4649, 314, 2411, 30, 378, 3458, 282, 4649, 314]


def dense_checkpoint(folder: Path) -> Path:
    """A tiny random Llama (2 layers, hidden 256, float32 safetensors) with the bundled model's tokenizer, written
    to ``folder``: dense weights for a method to quantize, and text for one that calibrates."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from frame.model_source import ModelSource

    tokenizer = ModelSource.open(None).tokenizer
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, initializer_range=0.05, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


class QuantizationConformance:
    """The contract of :class:`~frame.interfaces.quantization.QuantizationMethod` and its packed weights."""

    plugin_name: ClassVar[str]
    #: Largest ``|dequantised - dense| / max|dense|`` of a weight the method quantizes itself (below 0.5: a method
    #: must keep the weights, not their shape).
    rtol: ClassVar[float] = 0.05
    model_family: ClassVar[str] = "llama"
    #: Smallest correlation, at any position of the prompt, of the model's logits with the dense model's (int8 per
    #: channel keeps 0.999 on the default checkpoint, int4 per group of 128 0.9, zeros none).
    min_correlation: ClassVar[float] = 0.8

    @pytest.fixture(scope="class")
    def checkpoint(self, tmp_path_factory: pytest.TempPathFactory) -> Path:
        return dense_checkpoint(tmp_path_factory.mktemp("dense"))

    @pytest.fixture(scope="class")
    def hooks(self) -> PluginHooks:
        return PluginHooks(PluginRegistry())

    @pytest.fixture(scope="class")
    def method(self, hooks: PluginHooks) -> QuantizationMethod:
        return hooks.create_quantization(self.plugin_name, None)

    @pytest.fixture(scope="class")
    def dense(self, checkpoint: Path) -> dict[str, torch.Tensor]:
        return dict(open_weights(checkpoint).tensors())

    @pytest.fixture(scope="class")
    def packed(self, method: QuantizationMethod, checkpoint: Path, dense: dict[str, torch.Tensor]
               ) -> dict[str, tuple[PackedWeight, bool]]:
        """Every weight the method packs, by name, and whether it arrived packed (True) or was quantized."""
        out: dict[str, tuple[PackedWeight, bool]] = {}
        source = method.open_weights(checkpoint)
        if source is not None:
            out.update((n, (t, True)) for n, t in source.tensors() if isinstance(t, PackedWeight))
        for name, tensor in dense.items():
            if name not in out and tensor.dim() == 2:
                quantized = method.quantize(name, tensor)
                if quantized is not None:
                    out[name] = (quantized, False)
        return out

    def test_created_through_its_hook(self, method: QuantizationMethod) -> None:
        assert isinstance(method, QuantizationMethod)
        assert method.name == self.plugin_name
        declared = {f.name: f for f in method.packed_formats}
        assert method.formats and set(method.formats) <= set(FORMATS) | set(declared), (
            "a format that is not one of frame's own must be declared in packed_formats")
        for name, fmt in declared.items():
            assert issubclass(fmt.reference, PackedWeight) and fmt.reference.packed_format == fmt, name
            assert isinstance(fmt.kernels, tuple) and fmt.layout.strip(), name
        assert 0 < self.rtol < 0.5, "rtol must leave a method's weights close to the dense ones"

    def test_serves_the_checkpoint(self, method: QuantizationMethod, checkpoint: Path) -> None:
        assert method.check(checkpoint, None) is None

    def test_packs_some_weights(self, packed: dict[str, tuple[PackedWeight, bool]]) -> None:
        assert packed, "the method packed no weight of the checkpoint"

    def test_packed_weights_hold_the_checkpoint(self, method: QuantizationMethod,
                                                packed: dict[str, tuple[PackedWeight, bool]],
                                                dense: dict[str, torch.Tensor]) -> None:
        declared = {f.name: f for f in method.packed_formats}
        for name, (weight, arrived_packed) in packed.items():
            assert weight.format in method.formats, name
            if weight.format in declared:  # its reference is the declared class's dequantize
                assert isinstance(weight, declared[weight.format].reference), name
            values = weight.dequantize()
            assert values.dtype == torch.float32 and values.shape == dense[name].shape == weight.shape, name
            assert weight.nbytes < values.numel() * 2, f"{name}: {weight.nbytes} bytes is not smaller than bfloat16"
            if arrived_packed:  # read packed: the same numbers the dense reader gives
                torch.testing.assert_close(values, dense[name], rtol=0, atol=0, msg=name)
            else:
                error = (values - dense[name]).abs().max() / dense[name].abs().max().clamp_min(1e-12)
                assert error <= self.rtol, f"{name}: relative error {error:.4f} > {self.rtol}"

    def test_quantize_leaves_its_input(self, method: QuantizationMethod) -> None:
        weight = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
        before = weight.clone()
        result = method.quantize("layers.0.mlp.down_proj", weight)
        assert torch.equal(weight, before)
        assert result is None or result.shape == weight.shape

    def test_row_operations_commute_with_dequantisation(self, packed: dict[str, tuple[PackedWeight, bool]]) -> None:
        _, (weight, _) = min(packed.items(), key=lambda item: item[1][0].nbytes)
        values, rows = weight.dequantize(), weight.shape[0]
        order = torch.randperm(rows, generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(weight[order].dequantize(), values[order], rtol=0, atol=0)
        torch.testing.assert_close(weight.narrow(0, 1, rows - 2).dequantize(), values[1:-1], rtol=0, atol=0)
        torch.testing.assert_close(weight.narrow(-1, 0, weight.shape[1]).dequantize(), values, rtol=0, atol=0)
        joined = PackedWeight.cat([weight.rows(slice(0, rows // 2)), weight.rows(slice(rows // 2, rows))])
        assert joined is not None
        torch.testing.assert_close(joined.dequantize(), values, rtol=0, atol=0)

    def test_model_keeps_the_dense_models_logits(self, hooks: PluginHooks, method: QuantizationMethod,
                                                 checkpoint: Path) -> None:
        """Logits, not greedy tokens: a random model's top tokens are too close for token agreement to judge."""
        dense = self._logits(hooks, None, checkpoint)
        quantized = self._logits(hooks, method, checkpoint)
        d, q = dense - dense.mean(-1, keepdim=True), quantized - quantized.mean(-1, keepdim=True)
        correlation = ((d * q).sum(-1) / (d.norm(dim=-1) * q.norm(dim=-1)).clamp_min(1e-12)).min().item()
        assert correlation >= self.min_correlation, (
            f"the logits correlate {correlation:.3f} with the dense model's at worst (< {self.min_correlation})")

    @staticmethod
    def _calibrate(model: torch.nn.Module, attention: object, method: QuantizationMethod | None,
                   source: object) -> dict[str, torch.Tensor] | None:
        """What a worker does between loading and quantizing: the method's calibration pass, if it asks for one."""
        from frame.engine.worker.calibration import input_absmax, token_chunks

        text = method.calibration_text() if method is not None else None
        if text is None:
            return None
        chunks = token_chunks(source.tokenizer(text).input_ids, 256)  # type: ignore[attr-defined]
        return input_absmax(model, attention, chunks, 16, torch.float32, torch.device("cpu"))  # type: ignore[arg-type]

    def _logits(self, hooks: PluginHooks, method: QuantizationMethod | None, checkpoint: Path) -> torch.Tensor:
        from frame.model_source import ModelSource
        from frame.testing.model import PagedRunner

        source = ModelSource.open(str(checkpoint))
        hf = source.hf_config
        heads, kv_heads = hf.num_attention_heads, getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
        platform = hooks.create_platform("cpu", None)
        attention = hooks.create_attention("sdpa", num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                                           scale=head_dim**-0.5, dtype=torch.float32, platform=platform, options=None)
        model = hooks.create_model(self.model_family, hf, torch.float32, torch.device("cpu"), attention)
        packed_source = method.open_weights(checkpoint) if method is not None else None
        model.load_weights(packed_source or open_weights(checkpoint))
        finish_loading(model, method, self._calibrate(model, attention, method, source))
        attach_platform_kernels(model, platform)
        runner = PagedRunner(model, attention, 1, len(PROMPT), torch.float32, torch.device("cpu"))
        return runner.step({0: PROMPT})[0]
