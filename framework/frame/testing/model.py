"""Conformance suite of model-family plugins: the family's logits against Hugging Face transformers.

Subclass :class:`ModelFamilySuite` with ``plugin_name = "<family>"``. For every architecture the family claims,
the suite builds a tiny random transformers model (2 layers, hidden 64), saves it as safetensors, loads it into
the family through its hooks and :func:`frame.weights.open_weights`, and checks the logits of a full prefill, of
the same prompt as prefill chunks and decode steps through a paged cache, and of a batch mixing a decode with a
prefill. Add configs through :meth:`ModelFamilySuite.extra_configs` (rope scalings, biases, tied embeddings).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from frame.interfaces.attention import AttentionBackend
from frame.interfaces.model import CausalLM, WeightSource
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.testing.attention import build_metadata
from frame.weights import open_weights

#: Sizes of the tiny models; families whose configs spell these differently override :meth:`tiny_config`.
TINY = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 97, "max_position_embeddings": 128, "tie_word_embeddings": False}
BLOCK_SIZE = 4


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Give every parameter (biases and norm weights too) random values, so none can go unloaded unnoticed."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            param.copy_(1 + 0.2 * noise if "norm" in name else 0.1 * noise)


class EditedSource(WeightSource):
    """A WeightSource with some tensors dropped or added, to check the family's error messages."""

    def __init__(self, inner: WeightSource, drop: frozenset[str] = frozenset(),
                 add: dict[str, torch.Tensor] | None = None) -> None:
        self.inner, self.drop, self.add = inner, drop, add or {}
        self.format = inner.format

    def __len__(self) -> int:
        return len(self.inner) - len(self.drop) + len(self.add)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from ((n, t) for n, t in self.inner.tensors() if n not in self.drop)
        yield from self.add.items()


class PagedRunner:
    """Drives a CausalLM step by step over a paged KV pool, each sequence owning fixed (reversed) blocks."""

    def __init__(self, model: CausalLM, attention: AttentionBackend, num_seqs: int, max_len: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        spec = model.kv_cache_spec
        per_seq = math.ceil(max_len / BLOCK_SIZE)
        blocks = num_seqs * per_seq + 1
        shape = (blocks, BLOCK_SIZE, spec.num_kv_heads, spec.head_dim)
        self.caches = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                       for _ in range(spec.num_layers)]
        # Reversed, skipping block 0: a model that assumes contiguous blocks gets a wrong answer.
        self.tables = [list(range(blocks - 1 - s * per_seq, blocks - 1 - (s + 1) * per_seq, -1))
                       for s in range(num_seqs)]
        self.model, self.attention, self.device = model, attention, device
        self.cached = [0] * num_seqs

    def step(self, work: dict[int, list[int]]) -> list[torch.Tensor]:
        """Run ``{seq: new token ids}`` as one batch; returns each sequence's logits ``[new tokens, vocab]``."""
        seqs = list(work)
        meta = build_metadata([self.cached[s] for s in seqs], [len(work[s]) for s in seqs],
                              [self.tables[s] for s in seqs], BLOCK_SIZE, self.device)
        ids = torch.tensor([t for s in seqs for t in work[s]], device=self.device)
        positions = torch.tensor([self.cached[s] + i for s in seqs for i in range(len(work[s]))], device=self.device)
        meta = self.attention.build_metadata(meta)
        logits = self.model.compute_logits(self.model(ids, positions, self.caches, meta))
        for s in seqs:
            self.cached[s] += len(work[s])
        return list(logits.split([len(work[s]) for s in seqs]))


class ModelFamilySuite:
    """The checks every model family passes, against transformers in float32."""

    plugin_name: ClassVar[str]
    attention_name: ClassVar[str] = "sdpa"
    platform_name: ClassVar[str] = "cpu"
    atol: ClassVar[float] = 1e-4

    def extra_configs(self) -> dict[str, PretrainedConfig]:
        """More configs to check beyond one tiny config per architecture (name -> config)."""
        return {}

    def tiny_config(self, architecture: str, **overrides: Any) -> PretrainedConfig:
        """A tiny transformers config of ``architecture``."""
        types = [t for t, a in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items() if a == architecture]
        preferred = architecture.removesuffix("ForCausalLM").lower()
        model_type = preferred if preferred in types else types[0]
        return AutoConfig.for_model(model_type, architectures=[architecture], **{**TINY, **overrides})

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "case" in metafunc.fixturenames:
            hooks = PluginHooks(PluginRegistry())
            names = [*hooks.model_architectures(self.plugin_name), *self.extra_configs()]
            metafunc.parametrize("case", names, scope="class")

    @pytest.fixture(scope="class")
    def hooks(self) -> PluginHooks:
        return PluginHooks(PluginRegistry())

    @pytest.fixture(scope="class")
    def platform(self, hooks: PluginHooks):
        options_model = hooks.options_model("platform", self.platform_name)
        platform = hooks.create_platform(self.platform_name, options_model() if options_model else None)
        platform.name = self.platform_name
        return platform

    def make_attention(self, hooks: PluginHooks, platform, config: PretrainedConfig) -> AttentionBackend:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        options_model = hooks.options_model("attention", self.attention_name)
        return hooks.create_attention(
            self.attention_name, num_heads=heads, num_kv_heads=config.num_key_value_heads, head_dim=head_dim,
            scale=head_dim**-0.5, dtype=torch.float32, platform=platform,
            options=options_model() if options_model else None,
        )

    @pytest.fixture(scope="class")
    def built(self, case: str, hooks: PluginHooks, platform, tmp_path_factory: pytest.TempPathFactory):
        """``(transformers model, family model, attention, checkpoint folder)`` for ``case``."""
        extra = self.extra_configs()
        config = extra[case] if case in extra else self.tiny_config(case)
        torch.manual_seed(0)
        reference = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        randomize_(reference, seed=len(case))
        folder: Path = tmp_path_factory.mktemp(case)
        reference.save_pretrained(folder)
        loaded_config = AutoConfig.from_pretrained(folder)
        attention = self.make_attention(hooks, platform, loaded_config)
        model = hooks.create_model(self.plugin_name, hf_config=loaded_config, dtype=torch.float32,
                                   device=platform.device, attention=attention)
        model.load_weights(open_weights(folder))
        return reference, model, attention, folder

    @staticmethod
    def reference_logits(reference: torch.nn.Module, ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return reference(torch.tensor([ids])).logits[0].float()

    @staticmethod
    def prompt(seed: int, length: int, vocab: int) -> list[int]:
        return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()

    def assert_close(self, actual: torch.Tensor, expected: torch.Tensor) -> None:
        assert actual.dtype == torch.float32
        torch.testing.assert_close(actual.cpu(), expected, atol=self.atol, rtol=1e-4)

    # -- the checks ---------------------------------------------------------------------------------------
    def test_kv_cache_spec(self, built) -> None:
        reference, model, attention, _ = built
        spec = model.kv_cache_spec
        assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (
            reference.config.num_hidden_layers, attention.num_kv_heads, attention.head_dim)

    def test_full_prefill_matches_transformers(self, built, platform) -> None:
        reference, model, attention, _ = built
        ids = self.prompt(1, 13, reference.config.vocab_size)
        runner = PagedRunner(model, attention, 1, 16, torch.float32, platform.device)
        self.assert_close(runner.step({0: ids})[0], self.reference_logits(reference, ids))

    def test_chunked_prefill_and_decode_match_transformers(self, built, platform) -> None:
        reference, model, attention, _ = built
        ids = self.prompt(2, 14, reference.config.vocab_size)
        runner = PagedRunner(model, attention, 1, 16, torch.float32, platform.device)
        chunks = [ids[:5], ids[5:7], ids[7:11], *([t] for t in ids[11:])]
        logits = torch.cat([runner.step({0: chunk})[0] for chunk in chunks])
        self.assert_close(logits, self.reference_logits(reference, ids))

    def test_batch_mixing_decode_and_prefill_matches_transformers(self, built, platform) -> None:
        reference, model, attention, _ = built
        a, b, c = (self.prompt(seed, n, reference.config.vocab_size) for seed, n in ((3, 9), (4, 7), (5, 12)))
        runner = PagedRunner(model, attention, 3, 16, torch.float32, platform.device)
        runner.step({0: a[:-1], 2: c[:6]})
        out = runner.step({0: a[-1:], 1: b, 2: c[6:]})
        self.assert_close(out[0], self.reference_logits(reference, a)[-1:])
        self.assert_close(out[1], self.reference_logits(reference, b))
        self.assert_close(out[2], self.reference_logits(reference, c)[6:])

    def test_missing_and_unknown_tensors_are_named(self, built, hooks, platform) -> None:
        reference, _, attention, folder = built
        source = open_weights(folder)
        names = [n for n, _ in source.tensors()]
        # The second layer's MLP, however the architecture names it (model.layers.1.mlp..., transformer.h.1.mlp...).
        dropped = next(n for n in names if ".1." in n and "mlp" in n)
        fresh = hooks.create_model(self.plugin_name, hf_config=reference.config, dtype=torch.float32,
                                   device=platform.device, attention=attention)
        with pytest.raises(ValueError, match=r"lacks|missing") as err:
            fresh.load_weights(EditedSource(source, drop=frozenset({dropped})))
        assert ".1." in str(err.value) and "mlp" in str(err.value)
        with pytest.raises(ValueError, match=r"model\.layers\.0\.surprise\.weight"):
            fresh.load_weights(EditedSource(source, add={"model.layers.0.surprise.weight": torch.zeros(2)}))
