"""Conformance suite of model-family plugins: the family's logits against Hugging Face transformers.

Subclass :class:`ModelFamilySuite` with ``plugin_name = "<family>"``. For every architecture the family claims
(:meth:`ModelFamilySuite.architectures`), the suite builds a tiny random transformers model from the family's own
tiny config (:meth:`ModelFamilySuite.tiny_config`: 2 layers, hidden 64 by default; a family whose configs spell
sizes otherwise overrides it), saves it as safetensors, builds the family through its hooks exactly as the engine
does (its per-layer attention specs, one backend per distinct spec) and loads the checkpoint through
:func:`frame.weights.open_weights`. It checks the logits of a full prefill, of the same prompt as prefill chunks and
decode steps through a paged cache, and of a batch mixing a decode with prefills; that every checkpoint tensor is
needed and a stranger (:attr:`ModelFamilySuite.surprise_tensor`) is named; that a ``quantization_config`` the
family has no loader for is refused in one sentence; and that a decode step the platform records (its graph seam)
replays with the eager step's logits. Prompts are longer than any window a tiny config should set
(keep ``sliding_window`` at 8 or less so the windows matter). Add configs through
:meth:`ModelFamilySuite.extra_configs` (rope scalings, biases, tied embeddings, windows).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from frame.engine.worker.attention_layers import create_layer_attention, family_specs
from frame.engine.worker.graphs import DecodeGraphs
from frame.errors import UnsupportedModelError
from frame.interfaces.attention import AttentionBackend
from frame.interfaces.model import CausalLM, WeightSource
from frame.layers import attach_platform_kernels, finish_loading
from frame.model_source import ModelSource
from frame.plugins.families import family_for
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.testing.attention import build_metadata
from frame.testing.family_llamacpp import LlamaCppPresetChecks
from frame.testing.gguf import NoLlamaCppName, as_stored, int8_activation_logits, write_gguf
from frame.testing.random_weights import randomize_
from frame.weights import open_weights

#: Sizes of the tiny models; families whose configs spell these differently override :meth:`tiny_config`.
TINY = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 97, "max_position_embeddings": 128, "tie_word_embeddings": False}
BLOCK_SIZE = 4
#: Largest logit error of a model read packed, as a share of the largest logit, against the float32 logits or those
#: of 8-bit activations (measured worst: 3.4% off the float32 logits, but for the Gemma 3 six-layer case, 18% off
#: them and 3e-7 off the 8-bit ones on the CPU platform's kernels).
PACKED_LOGIT_TOLERANCE = 0.05


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


class ModelFamilySuite(LlamaCppPresetChecks):
    """The checks every model family passes, against transformers in float32 (and, where llama-cpp-python is at
    hand, against llama.cpp on its own quantization presets: :class:`LlamaCppPresetChecks`)."""

    plugin_name: ClassVar[str]
    attention_name: ClassVar[str] = "sdpa"
    platform_name: ClassVar[str] = "cpu"
    atol: ClassVar[float] = 1e-4
    #: The attention backend of the recorded-decode check: one that lets a platform record its steps.
    graph_attention_name: ClassVar[str] = "cpu_paged"
    #: A checkpoint tensor name the family must refuse as unknown (spelled like the family's layer tensors).
    surprise_tensor: ClassVar[str] = "model.layers.0.surprise.weight"
    #: Whether the GGUF check reads the config from the file's metadata and expects this family for it (True), or
    #: builds from the checkpoint's own config (a family whose architecture llama.cpp has no name for).
    gguf_config_from_file: bool = True

    def gguf_architecture(self, architecture: str) -> str | None:
        """llama.cpp's architecture (a ``gguf.MODEL_ARCH`` member name) for the GGUF check of ``architecture``; None
        (the default, for a family that reads no GGUF) skips the check."""
        return None

    def gguf_convert(self, name: str, tensor: torch.Tensor, config: PretrainedConfig) -> torch.Tensor:
        """What llama.cpp's converter does to checkpoint tensor ``name`` of this family (nothing, by default)."""
        return tensor

    def gguf_transposed(self, name: str) -> bool:
        """True when :meth:`gguf_convert` transposes parameter ``name`` (GPT-2's Conv1D weights): the file's blocks
        then run along its other axis."""
        return False

    def gguf_metadata(self, writer: gguf.GGUFWriter, config: PretrainedConfig) -> None:
        """The keys (and extra tensors) llama.cpp's converter writes for this architecture beyond every text model's
        (:func:`frame.testing.gguf.write_text_model_keys`); ``pytest.skip`` for a config the converter cannot
        state (a value the file has no key for)."""

    def registry(self) -> PluginRegistry:
        """Where the suite finds the family: the installed plugins (a test of a family that is not installed as a
        wheel registers its module here, see :mod:`frame.testing.registration`)."""
        return PluginRegistry()

    def architectures(self) -> list[str]:
        """The architectures to check with one tiny config each: every one the family lists (a fallback family
        that lists hundreds picks a few)."""
        return PluginHooks(self.registry()).model_architectures(self.plugin_name)

    def extra_configs(self) -> dict[str, PretrainedConfig]:
        """More configs to check beyond one tiny config per architecture (name -> config)."""
        return {}

    def tiny_config(self, architecture: str, **overrides: Any) -> PretrainedConfig:
        """A tiny transformers config of ``architecture`` (override for configs that spell sizes otherwise)."""
        types = [t for t, a in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items() if a == architecture]
        preferred = architecture.removesuffix("ForCausalLM").lower()
        model_type = preferred if preferred in types else types[0]
        return AutoConfig.for_model(model_type, architectures=[architecture], **{**TINY, **overrides})

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "case" in metafunc.fixturenames:
            metafunc.parametrize("case", [*self.architectures(), *self.extra_configs()], scope="class")
        if "wide_case" in metafunc.fixturenames:
            metafunc.parametrize("wide_case", [a for a in self.architectures() if self.gguf_architecture(a)],
                                 scope="class")

    @pytest.fixture(scope="class")
    def hooks(self) -> PluginHooks:
        return PluginHooks(self.registry())

    @pytest.fixture(scope="class")
    def platform(self, hooks: PluginHooks):
        options_model = hooks.options_model("platform", self.platform_name)
        platform = hooks.create_platform(self.platform_name, options_model() if options_model else None)
        platform.name = self.platform_name
        return platform

    def make_attention(self, hooks: PluginHooks, platform, config: PretrainedConfig,
                       name: str | None = None) -> list[AttentionBackend]:
        """One backend per layer, made as the engine makes them from the family's per-layer specs (backend
        ``name``, the suite's :attr:`attention_name` by default)."""
        name = name or self.attention_name
        options_model = hooks.options_model("attention", name)
        specs = family_specs(hooks, self.plugin_name, config, None)
        return create_layer_attention(hooks, name, specs, world_size=1, rank=0, dtype=torch.float32,
                                      platform=platform, options=options_model() if options_model else None)

    def make_model(self, hooks: PluginHooks, platform, config: PretrainedConfig,
                   layers: list[AttentionBackend]) -> CausalLM:
        return hooks.create_model(self.plugin_name, hf_config=config, dtype=torch.float32, device=platform.device,
                                  attention=layers[0], layer_attention=layers)

    @pytest.fixture(scope="class")
    def built(self, case: str, hooks: PluginHooks, platform, tmp_path_factory: pytest.TempPathFactory):
        """``(transformers model, family model, first layer's attention, checkpoint folder)`` for ``case``."""
        extra = self.extra_configs()
        config = extra[case] if case in extra else self.tiny_config(case)
        torch.manual_seed(0)
        reference = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        randomize_(reference, seed=len(case))
        folder: Path = tmp_path_factory.mktemp(case)
        reference.save_pretrained(folder)
        loaded_config = AutoConfig.from_pretrained(folder)
        layers = self.make_attention(hooks, platform, loaded_config)
        model = self.make_model(hooks, platform, loaded_config, layers)
        model.load_weights(open_weights(folder))
        return reference, model, layers[0], folder

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
    def test_kv_cache_spec(self, built, hooks) -> None:
        reference, model, attention, _ = built
        specs = family_specs(hooks, self.plugin_name, reference.config, None)
        spec = model.kv_cache_spec
        assert len(specs) == reference.config.num_hidden_layers
        assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (
            sum(s.kv_source is None for s in specs), attention.num_kv_heads, attention.head_dim)

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

    def test_recorded_decode_steps_match_the_eager_ones(self, built, hooks, platform) -> None:
        """Where the platform records decode steps (``Platform.capture_graph``), replaying the recording of the
        family's own forward gives the eager step's logits, bit for bit, step after step; where it has a greedy
        kernel (``Platform.greedy_kernel``), the step's argmax per row is numpy's over those logits."""
        reference, _, _, folder = built
        if self.graph_attention_name not in hooks.registry.names("attention"):
            pytest.skip(f"the {self.graph_attention_name} attention backend is not installed")
        layers = self.make_attention(hooks, platform, reference.config, self.graph_attention_name)
        model = self.make_model(hooks, platform, reference.config, layers)
        model.load_weights(open_weights(folder))
        runner = PagedRunner(model, layers[0], 3, 16, torch.float32, platform.device)
        prompts = [self.prompt(seed, n, reference.config.vocab_size) for seed, n in ((6, 5), (7, 9), (8, 3))]
        runner.step(dict(enumerate(prompts)))
        graphs = DecodeGraphs(model, layers[0], runner.caches, platform.device, max_num_seqs=3, max_model_len=16,
                              block_size=BLOCK_SIZE, scratch_block=0, capture=platform.capture_graph,
                              greedy=platform.greedy_kernel())
        if not graphs.enabled:
            pytest.skip(f"the {platform.name} platform records no decode steps")
        for token in (11, 12, 13):  # the first replay records, the next two replay the recording
            positions = np.array(runner.cached, dtype=np.int64)
            slots = np.array([runner.tables[s][p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
                              for s, p in enumerate(positions)])
            eager = torch.cat(runner.step({s: [token + s] for s in range(3)}))  # writes the same KV rows
            replayed = graphs.run(np.array([token, token + 1, token + 2]), positions, slots, positions + 1,
                                  np.array(runner.tables, dtype=np.int32))
            assert torch.equal(replayed, eager)
            argmax = graphs.greedy_tokens(3)
            if argmax is not None:
                assert argmax.tolist() == replayed.float().cpu().numpy().argmax(-1).tolist()

    def test_missing_and_unknown_tensors_are_named(self, built, hooks, platform) -> None:
        reference, _, _, folder = built
        source = open_weights(folder)
        names = [n for n, _ in source.tensors()]
        # A tensor of the second layer, its MLP's where the names say so (model.layers.1.mlp..., transformer.h.1...).
        second = [n for n in names if re.search(r"(?:^|\.)(?:layers|h|blocks)\.1\.", n)]
        dropped = next((n for n in second if "mlp" in n), second[0])
        layers = self.make_attention(hooks, platform, reference.config)
        fresh = self.make_model(hooks, platform, reference.config, layers)
        with pytest.raises(ValueError, match=r"lacks|missing") as err:
            fresh.load_weights(EditedSource(source, drop=frozenset({dropped})))
        assert ".1." in str(err.value)
        with pytest.raises(ValueError, match=re.escape(self.surprise_tensor)):
            fresh.load_weights(EditedSource(source, add={self.surprise_tensor: torch.zeros(2)}))

    @pytest.mark.parametrize("file_type", ["f16", "q8_0", "q8_0-packed"])
    def test_gguf_file_matches_transformers(self, built, hooks, platform, tmp_path: Path, file_type: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
        """The same checkpoint written as llama.cpp's converter writes it (gguf-py's tensor names and metadata keys,
        the converter's transforms, a tokenizer), in float16 and in q8_0: frame rebuilds the config from the file's
        metadata, picks this family for it, and gives transformers' logits on the values the file holds. Read
        packed (``q8_0-packed``, through the ``gguf`` quantization plugin: matrices and MoE expert stacks stay in
        their blocks, the platform's kernels multiply), the logits stay close to transformers' float32 ones or to those
        of 8-bit activations (a platform's kernels may round x to int8 per block of 32, as llama.cpp's do)."""
        packed = file_type.endswith("-packed")
        file_type = file_type.removesuffix("-packed")
        if packed and "gguf" not in hooks.registry.names("quantization"):
            pytest.skip("the gguf quantization plugin is not installed")
        reference, _, _, folder = built
        config = reference.config
        architecture = self.gguf_architecture((getattr(config, "architectures", None) or [""])[0])
        if architecture is None:
            pytest.skip("the family lists no llama.cpp architecture for this one")
        path = tmp_path / f"model-{file_type}.gguf"
        try:
            write_gguf(open_weights(folder), path, architecture, config.num_hidden_layers,
                       lambda name, tensor: self.gguf_convert(name, tensor, config), config=config,
                       file_type=file_type, metadata=lambda writer: self.gguf_metadata(writer, config))
        except NoLlamaCppName as err:
            pytest.skip(f"a variant llama.cpp does not run: {err}")
        shared_cache = os.environ.get("FRAME_CACHE_DIR")
        monkeypatch.setenv("FRAME_CACHE_DIR", str(tmp_path / "cache"))
        hf_config = config
        if self.gguf_config_from_file:
            source = ModelSource.open(str(path))
            assert family_for(hooks, source.architecture) == self.plugin_name
            hf_config = source.hf_config
        layers = self.make_attention(hooks, platform, hf_config)
        model = self.make_model(hooks, platform, hf_config, layers)
        if packed:
            method = hooks.create_quantization("gguf", None)
            model.load_weights(method.open_weights(path))
            assert finish_loading(model, method) > 0
            # The platform's native kernels build once into the shared cache, not into this test's folder.
            if shared_cache is None:
                monkeypatch.delenv("FRAME_CACHE_DIR")
            else:
                monkeypatch.setenv("FRAME_CACHE_DIR", shared_cache)
            attach_platform_kernels(model, platform)
        else:
            model.load_weights(open_weights(path))
        stored = copy.deepcopy(reference)
        with torch.no_grad():
            for name, param in stored.named_parameters():
                flip = self.gguf_transposed(name)
                values = as_stored(param.data.t() if flip else param.data, file_type, name)
                param.copy_(values.t() if flip else values)
        ids = self.prompt(6, 13, config.vocab_size)
        runner = PagedRunner(model, layers[0], 1, 16, torch.float32, platform.device)
        logits, expected = runner.step({0: ids})[0], self.reference_logits(stored, ids)
        if not packed:
            self.assert_close(logits, expected)
            return
        # The packed kernels may round activations to 8 bits as llama.cpp's do: close to the float32 logits, or to
        # those of the same rounding, which a small model with sharp attention amplifies (Gemma 3: 18%).
        scale = expected.abs().max().item()
        worst = (logits.cpu() - expected).abs().max().item()
        rounded = (logits.cpu() - int8_activation_logits(stored, ids)).abs().max().item()
        assert min(worst, rounded) <= PACKED_LOGIT_TOLERANCE * scale, (
            f"packed logits off by {worst:.4f}, {rounded:.4f} from those of 8-bit activations (largest {scale:.4f})")

    def test_quantization_config_without_a_loader_is_refused(self, built, hooks) -> None:
        """A quantized checkpoint the family cannot load is one sentence naming the field, never wrong numbers."""
        config = copy.deepcopy(built[0].config)
        config.quantization_config = {"quant_method": "gptq", "bits": 4}
        with pytest.raises(UnsupportedModelError, match="quantization_config") as err:
            family_specs(hooks, self.plugin_name, config, None)
            hooks.create_model(self.plugin_name, hf_config=config, dtype=torch.float32,
                               device=torch.device("cpu"), attention=built[2], layer_attention=None)
        assert str(err.value).count(". ") == 0 and str(err.value).endswith(".")

    def test_one_backend_for_layers_that_need_more_is_refused(self, built, hooks, platform) -> None:
        """Passing a single plain backend to a model whose layers need windows or soft-caps must fail, not serve
        them with full attention, nor layers of another scale (and a model whose layers all have one spec takes
        it)."""
        reference = built[0]
        specs = family_specs(hooks, self.plugin_name, reference.config, None)
        if not specs[0].features and all(s == specs[0] for s in specs):  # one plain backend serves all: taken
            model = hooks.create_model(self.plugin_name, hf_config=reference.config, dtype=torch.float32,
                                       device=platform.device, attention=built[2], layer_attention=None)
            assert model.kv_cache_spec == built[1].kv_cache_spec
            return
        plain = create_layer_attention(hooks, self.attention_name, [dataclasses.replace(specs[0], sliding_window=None,
                                                                                        logit_softcap=None)],
                                       world_size=1, rank=0, dtype=torch.float32, platform=platform, options=None)[0]
        with pytest.raises(ValueError, match=r"sliding_window|logit_softcap|scale"):
            hooks.create_model(self.plugin_name, hf_config=reference.config, dtype=torch.float32,
                               device=platform.device, attention=plain, layer_attention=None)
