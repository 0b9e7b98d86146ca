"""Third parties ship plugins of every kind, as a new author would, and a broken one never takes the others down.

For each kind, `frame new-plugin` writes the skeleton, the author fills it in (the files in ``third_party/`` and a
few edits; the attention backend and the platform are the skeletons as written) and runs its own tests before
installing anything; then builds the wheel. A user installs the wheels into a fresh venv from a folder of wheels,
frame-engine's own among them, runs `frame plugins` and generates with them. Beside them sits a wheel whose plugins
raise in their probing hooks or fail to import.

No index is reachable here, and torch, transformers and the rest cannot be rebuilt as wheels, so each fresh venv
sees them through a read-only layer: a folder of symlinks to this project's installed third-party packages, minus
frame and every frame plugin, added to the venv by a ``.pth`` file. pip takes those as already installed; every
frame distribution comes only from the wheel folder (``--no-index --find-links``, no pip config), and
frame-engine's wheel is built once per session from a copy of this checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

import pytest
from frame.plugin_templates import TEMPLATES
from frame.version import API_VERSION

ROOT = Path(__file__).resolve().parents[2]
FILLED = Path(__file__).parent / "third_party"
#: kind -> the plugin each kind's author writes (its filled-in module is third_party/<the kind's module>.py).
AUTHORED = {"platform": "plain_cpu", "attention": "gather", "cache": "noshare", "scheduler": "sjf", "model": "gpt2"}
#: In-tree plugins built beside frame-engine: the suites run on cpu/sdpa, generations use the defaults and llama.
IN_TREE = ["platforms/cpu", "attention/sdpa", "caches/hashchain", "schedulers/fcfs", "models/llama"]
QUESTION = "What is the capital of France?"

pytestmark = pytest.mark.slow


@dataclass
class Venv:
    """A fresh virtual environment and the environment variables to run its commands with."""

    path: Path
    env: dict[str, str]

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    def run(self, *args: str | Path, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([str(a) for a in args], env=self.env, cwd=cwd, capture_output=True, text=True,
                                timeout=600)
        if check:
            assert result.returncode == 0, f"{args}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        return result

    def frame(self, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess:
        return self.run(self.path / "bin" / "frame", *args, check=check)

    def install(self, index: Path, *requirements: str) -> None:
        subprocess.run([sys.executable, "-m", "pip", "--python", self.python, "install", "--quiet", "--no-index",
                        "--find-links", str(index), *requirements], env=self.env, check=True)


def _copy_source(source: Path, target: Path, parts: tuple[str, ...] | None = None) -> Path:
    """A clean copy of a distribution's source (``parts`` of it), so building it leaves nothing in the checkout."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "tests")
    target.mkdir(parents=True)
    for part in parts or [p.name for p in source.iterdir()]:
        if (source / part).is_dir():
            shutil.copytree(source / part, target / part, ignore=ignore)
        elif not ignore(str(source), [part]):
            shutil.copy(source / part, target / part)
    return target


@pytest.fixture(scope="session")
def wheel_folder(tmp_path_factory) -> Path:
    """frame-engine's wheel and the in-tree plugin wheels, built once per session into one folder."""
    root = tmp_path_factory.mktemp("index")
    sources = [_copy_source(ROOT, root / "core", ("pyproject.toml", "README.md", "framework")),
               *(_copy_source(ROOT / "plugins" / p, root / p) for p in IN_TREE)]
    folder = root / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
                    str(folder), *map(str, sources)], check=True, env=dict(os.environ, PIP_CONFIG_FILE=os.devnull))
    assert len(list(folder.glob("frame_engine-*.whl"))) == 1
    return folder


@pytest.fixture(scope="session")
def layer(tmp_path_factory) -> Path:
    """Symlinks to this project's installed packages, except frame, frame plugins and editable-install hooks."""
    folder = tmp_path_factory.mktemp("layer")
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name
        if name.startswith(("frame", "__editable__", "__pycache__")) or name.endswith(".pth"):
            continue
        (folder / name).symlink_to(entry)
    return folder


def _fresh_venv(path: Path, layer: Path) -> Venv:
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(path)],
                   check=True)
    site = Path(subprocess.run([str(path / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    (site / "_read_only_layer.pth").write_text(f"{layer}\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "FRAME_PLUGINS", "FRAME_DISABLE_PLUGINS")}
    env.update(PATH=f"{path / 'bin'}{os.pathsep}{env.get('PATH', '')}", PIP_CONFIG_FILE=os.devnull,
               XDG_CACHE_HOME=str(path / "xdg-cache"))
    return Venv(path, env)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"the skeleton's {path.name} changed; update this test's edit of it"
    path.write_text(text.replace(old, new))


#: The GPT-2 author's plugin module and tests: the model skeleton is a Llama-shaped family on frame.layers, and
#: GPT-2 is not Llama, so this author writes the hooks over a CausalLM of their own (third_party/model.py).
GPT2_PLUGIN = f'''"""The gpt2 model family plugin: its hooks, over the author's own CausalLM."""

from __future__ import annotations

import torch
from frame import hookimpl
from frame.interfaces.attention import AttentionBackend
from frame.interfaces.model import CausalLM
from transformers import PretrainedConfig

from frame_model_gpt2.model import Gpt2Model

FRAME_API_VERSION = {API_VERSION}


@hookimpl
def frame_model_architectures() -> list[str]:
    """GPT-2's Hugging Face architecture."""
    return ["GPT2LMHeadModel"]


@hookimpl
def frame_model_create(
    hf_config: PretrainedConfig, dtype: torch.dtype, device: torch.device, attention: AttentionBackend
) -> CausalLM:
    """The network for ``hf_config``, its weights not yet loaded."""
    return Gpt2Model(hf_config, attention).to(device=device, dtype=dtype)
'''
GPT2_TESTS = '''"""frame's model-family conformance suite: GPT-2 against transformers, tiny checkpoints."""

from frame.testing.model import ModelFamilySuite


class TestGpt2Model(ModelFamilySuite):
    plugin_name = "gpt2"

    def tiny_config(self, architecture, **overrides):
        # GPT-2 has no grouped-query attention: as many KV heads as query heads.
        return super().tiny_config(architecture, num_key_value_heads=4, **overrides)
'''


def _fill_in(kind: str, folder: Path) -> None:
    """What the author writes into the skeleton: the kind's module where the skeleton's is not what they want (the
    attention and platform skeletons, a plain-torch backend and a host-CPU platform, are kept as written), and
    for some kinds a hook or the tests."""
    package = folder / f"frame_{kind}_{AUTHORED[kind]}"
    module = TEMPLATES[kind].module
    if (FILLED / f"{module}.py").exists():
        shutil.copy(FILLED / f"{module}.py", package / f"{module}.py")
    plugin, tests = package / "plugin.py", folder / "tests" / "test_conformance.py"
    if kind == "attention":  # plain torch: it serves the third-party plain_cpu platform too
        _edit(plugin, 'return ["cpu", "cuda", "rocm"]', 'return ["cpu", "plain_cpu", "cuda", "rocm"]')
    if kind == "model":
        plugin.write_text(GPT2_PLUGIN)
        tests.write_text(GPT2_TESTS)


@pytest.fixture(scope="module")
def authored(wheel_folder: Path, layer: Path, tmp_path_factory) -> dict[str, dict[str, int]]:
    """Each kind's skeleton written by `frame new-plugin`, filled in, its tests run before anything of it is
    installed, then its wheel built into the wheel folder. Returns each kind's test outcomes."""
    root = tmp_path_factory.mktemp("authors")
    author = _fresh_venv(root / "venv", layer)
    author.install(wheel_folder, "frame-engine", "frame-platform-cpu", "frame-attention-sdpa")
    # `frame new-plugin` once per kind, through the installed command's main() in one process (the interpreter
    # and frame start once instead of five times).
    argv = [["new-plugin", "--kind", kind, "--name", name, "--dir", str(root)] for kind, name in AUTHORED.items()]
    author.run(author.python, "-c", f"from frame.cli.main import main\nfor a in {argv!r}:\n    assert main(a) == 0")
    folders = {kind: root / f"frame-{kind}-{name.replace('_', '-')}" for kind, name in AUTHORED.items()}
    for kind, folder in folders.items():
        _fill_in(kind, folder)
    ruff = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *map(str, folders.values())],
                          capture_output=True, text=True)
    assert ruff.returncode == 0, ruff.stdout  # what the author wrote keeps the skeleton's ruff settings
    # Each folder's tests as its README says, in one pytest session (importlib mode: every folder has a
    # tests/test_conformance.py); each folder's own conftest registers it from its source tree.
    report = root / "report.xml"
    author.run(author.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
               f"--junitxml={report}", *(folder / "tests" for folder in folders.values()), cwd=root, check=False)
    outcomes = _outcomes(report, folders)
    author.run(author.python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
               wheel_folder, *folders.values(), _broken_wheel_source(root))
    return outcomes


def _outcomes(report: Path, folders: dict[str, Path]) -> dict[str, dict[str, int]]:
    """Per kind, how many of its tests passed, failed (or errored) and were skipped, from pytest's JUnit XML
    (each skeleton's test class is Test<Name><Kind>)."""
    outcomes = {kind: {"passed": 0, "failed": 0, "skipped": 0} for kind in folders}
    classes = {f"Test{''.join(p.capitalize() for p in AUTHORED[k].split('_'))}{k.capitalize()}": k for k in folders}
    for case in ElementTree.parse(report).iter("testcase"):
        classname = case.get("classname", "")
        kind = classes.get(classname.rsplit(".", 1)[-1]) or next(
            (k for k, folder in folders.items() if folder.name in classname), None)
        assert kind is not None, ElementTree.tostring(case, encoding="unicode")
        tags = {child.tag for child in case}
        result = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
        outcomes[kind][result] += 1
    return outcomes


@pytest.mark.parametrize("kind", list(AUTHORED))
def test_each_kinds_own_tests_pass_before_it_is_installed(kind: str, authored) -> None:
    outcome = authored[kind]
    assert outcome["failed"] == 0 and outcome["passed"] >= 5, outcome


@pytest.fixture(scope="module")
def user(authored, wheel_folder: Path, layer: Path, tmp_path_factory) -> Venv:
    """A fresh venv where frame-engine comes in only as the plugins' dependency, from the wheel folder."""
    venv = _fresh_venv(tmp_path_factory.mktemp("user") / "venv", layer)
    venv.install(wheel_folder, *(f"frame-{kind}-{name.replace('_', '-')}" for kind, name in AUTHORED.items()),
                 "frame-broken-probes", "frame-platform-cpu", "frame-attention-sdpa", "frame-cache-hashchain",
                 "frame-scheduler-fcfs", "frame-model-llama")
    return venv


def test_frame_plugins_lists_them_and_gives_each_broken_one_a_row(user: Venv) -> None:
    rows = {(r["kind"], r["name"]): r for r in json.loads(user.frame("plugins", "--json").stdout)}
    for kind, name in AUTHORED.items():
        row = rows[(kind, name)]
        assert (row["wheel"], row["version"], row["runs_here"]) == (f"frame-{kind}-{name.replace('_', '-')}",
                                                                    "0.1.0", True), row
    assert rows[("model", "gpt2")]["why"] == "GPT2LMHeadModel"
    origin = "(wheel frame-broken-probes 1.0.0) cannot run here: its"
    fix = "fix or reinstall that wheel, or choose another of:"
    expected = {
        ("platform", "raising"): f"The platform plugin 'raising' {origin} frame_platform_check raised RuntimeError: "
                                 f"no device probe today; {fix} cpu, plain_cpu (--platform).",
        ("attention", "raising_list"): f"The attention plugin 'raising_list' {origin} frame_attention_platforms "
                                       f"raised KeyError: 'platforms'; {fix} gather, raising_check, sdpa (--attn).",
        ("attention", "raising_check"): "cannot run here: its frame_attention_check raised OSError: driver gone "
                                        "(wheel frame-broken-probes 1.0.0)",
        ("model", "raising"): f"The model plugin 'raising' {origin} frame_model_architectures raised ValueError: bad "
                              f"table; {fix} gpt2, llama (chosen by the checkpoint's architectures).",
        ("scheduler", "missing"): "The scheduler plugin 'missing' from wheel frame-broken-probes 1.0.0 failed to "
                                  "import (ModuleNotFoundError: No module named 'not_a_real_dependency'); reinstall "
                                  "that wheel or choose another of: fcfs, sjf (--sched).",
    }
    for key, why in expected.items():
        assert (rows[key]["runs_here"], rows[key]["why"]) == (False, why)
    assert rows[("platform", "cpu")]["runs_here"] and rows[("attention", "sdpa")]["runs_here"]


@pytest.fixture(scope="module")
def tiny_gpt2(smol_source, tmp_path_factory) -> Path:
    """A random two-layer GPT-2 with the bundled model's tokenizer: only the third-party family builds it."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(smol_source.tokenizer), n_positions=256, n_embd=64, n_layer=2, n_head=4)
    GPT2LMHeadModel(config).save_pretrained(folder)
    smol_source.tokenizer.save_pretrained(folder)
    return folder


def test_one_engine_runs_on_the_five_third_party_plugins(user: Venv, tiny_gpt2: Path) -> None:
    out = user.frame("generate", "--model", tiny_gpt2, "--platform", "plain_cpu", "--attn", "gather", "--cache",
                     "noshare", "--sched", "sjf", "--raw", "--prompt", QUESTION, "--prompt", QUESTION,
                     "--max-tokens", "8", "-v")
    requests = [line for line in out.stderr.splitlines() if line.startswith("request ")]
    # noshare reuses nothing, so even the repeated prompt computes all of its tokens.
    assert len(requests) == 2 and all(" 0 of them cached; 8 generated (length)" in r for r in requests), out.stderr


def test_the_default_generation_passes_over_the_broken_plugins(user: Venv) -> None:
    # Auto platform, auto backend and the family lookup for the bundled SmolLM2 each meet a plugin that raises.
    out = user.frame("generate", "--prompt", QUESTION, "--max-tokens", "8", "--dtype", "float32",
                     "--max-model-len", "256")
    assert "Paris" in out.stdout, out.stdout
    assert not out.stderr.strip(), out.stderr


def test_choosing_a_plugin_whose_probe_raises_is_one_line(user: Venv) -> None:
    out = user.frame("generate", "--prompt", "hi", "--platform", "raising", check=False)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "error: The platform plugin 'raising' (wheel frame-broken-probes 1.0.0) cannot run here: its "
        "frame_platform_check raised RuntimeError: no device probe today; fix or reinstall that wheel, or choose "
        "another of: cpu, plain_cpu (--platform)."
    ]


def _broken_wheel_source(root: Path) -> Path:
    """One wheel holding a platform, two backends and a family whose probing hooks raise, and a scheduler that
    does not import."""
    folder = root / "frame-broken-probes"
    package = folder / "frame_broken_probes"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    header = f"from frame import hookimpl\n\nFRAME_API_VERSION = {API_VERSION}\n\n\n"
    modules = {
        "platform": "@hookimpl\ndef frame_platform_check():\n    raise RuntimeError('no device probe today')\n\n\n"
                    "@hookimpl\ndef frame_platform_create(options):\n    raise AssertionError('never created')\n",
        "attention_list": "@hookimpl\ndef frame_attention_platforms():\n    raise KeyError('platforms')\n\n\n"
                          "@hookimpl\ndef frame_attention_create(num_heads):\n    raise AssertionError('never')\n",
        "attention_check": "@hookimpl\ndef frame_attention_platforms():\n    return ['cpu']\n\n\n"
                           "@hookimpl\ndef frame_attention_check(platform):\n    raise OSError('driver gone')\n\n\n"
                           "@hookimpl\ndef frame_attention_create(num_heads):\n    raise AssertionError('never')\n",
        "model": "@hookimpl\ndef frame_model_architectures():\n    raise ValueError('bad table')\n\n\n"
                 "@hookimpl\ndef frame_model_create(hf_config):\n    raise AssertionError('never')\n",
    }
    for module, body in modules.items():
        (package / f"{module}.py").write_text(header + body)
    (package / "scheduler.py").write_text("import not_a_real_dependency  # noqa: F401  (the wheel forgot it)\n")
    (folder / "pyproject.toml").write_text(textwrap.dedent('''
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "frame-broken-probes"
        version = "1.0.0"
        dependencies = ["frame-engine>=0.1"]

        [project.entry-points."frame.platforms"]
        raising = "frame_broken_probes.platform"

        [project.entry-points."frame.attention"]
        raising_list = "frame_broken_probes.attention_list"
        raising_check = "frame_broken_probes.attention_check"

        [project.entry-points."frame.models"]
        raising = "frame_broken_probes.model"

        [project.entry-points."frame.schedulers"]
        missing = "frame_broken_probes.scheduler"

        [tool.setuptools]
        packages = ["frame_broken_probes"]
    '''))
    return folder


def _recipe() -> str:
    """The first ``sh`` block of docs/plugins.md's "From a skeleton to a wheel on an index", as written."""
    text = (ROOT / "docs" / "plugins.md").read_text()
    section = text[text.index("## From a skeleton to a wheel on an index"):]
    return section[section.index("```sh\n") + len("```sh\n"):section.index("```\n", section.index("```sh\n") + 6)]


def test_the_fresh_venv_recipe_runs_as_written(wheel_folder: Path, layer: Path, tmp_path: Path) -> None:
    """The plugin guide's lines, unchanged, in one shell: a new venv, the core's cpu extra and the default model, a
    skeleton whose tests pass, its wheel, `frame plugins` and a generation with it. pip reads its settings from the
    environment (a folder of wheels, no index); torch and the other dependencies come from the read-only layer on
    PYTHONPATH instead of the network."""
    recipe = _recipe()
    assert 'pip install "frame-engine[cpu]"' in recipe and "frame generate --cache lfu" in recipe
    home, base = tmp_path / "home", tmp_path / "bin"
    home.mkdir()
    base.mkdir()  # `python` is an interpreter that is no venv's, and nothing else of its folder is on PATH
    (base / "python").symlink_to(getattr(sys, "_base_executable", sys.executable))
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "FRAME_PLUGINS", "FRAME_DISABLE_PLUGINS") and not k.startswith("PIP_")}
    env.update(HOME=str(home), PATH=f"{base}{os.pathsep}{env['PATH']}", PYTHONPATH=str(layer),
               PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheel_folder),
               PIP_NO_BUILD_ISOLATION="0", XDG_CACHE_HOME=str(home / ".cache"))
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", recipe], cwd=home, env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, f"{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    venv = home / "venvs" / "lfu"
    assert (venv / "bin" / "frame").is_file()  # frame itself came from the wheel folder, into the new venv
    assert " passed" in out.stdout and "Paris" in out.stdout, out.stdout[-4000:]
    requests = [line for line in out.stderr.splitlines() if line.startswith("request ")]
    assert len(requests) == 2, out.stderr[-3000:]
