"""Models named by their Hugging Face Hub id (``org/name``): the local Hugging Face cache first, then a download.

:func:`resolve` is huggingface_hub's ``snapshot_download`` over the files frame reads (config, safetensors,
tokenizer, chat template), so the cache is the one transformers and vLLM share (``$HF_HOME/hub``, or
``$HF_HUB_CACHE``), ``HF_HUB_OFFLINE=1`` keeps it to the cache, and ``HF_TOKEN`` or ``hf auth login`` opens gated
and private repositories. Each way it can fail is one sentence that says what to do.
"""

from __future__ import annotations

import re
from pathlib import Path

from frame.errors import ModelNotFoundError

#: The files a model folder needs; other weight formats (``.bin``, ``.gguf``, ``.onnx``) a repository may also hold
#: are not downloaded.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def is_hub_id(model: str) -> bool:
    """``org/name`` that is not a path on this machine (a local folder of that name wins, as in transformers)."""
    return bool(_HUB_ID.fullmatch(model)) and not model.endswith(".gguf") and not Path(model).expanduser().exists()


def resolve(repo_id: str) -> Path:
    """The local folder of ``repo_id``'s latest snapshot: from the cache, else downloaded where allowed."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"the Hugging Face cache ({constants.HF_HUB_CACHE})"
    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=ALLOW_PATTERNS))
    except GatedRepoError:
        raise ModelNotFoundError(
            f"{repo_id} is gated on the Hugging Face Hub and not in {where}; accept its terms at "
            f"https://huggingface.co/{repo_id} and log in (hf auth login, or set HF_TOKEN).", param="model") from None
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise ModelNotFoundError(
            f"{repo_id} is neither a folder here nor a model on the Hugging Face Hub (a private one needs hf auth "
            "login); check the name, or pass a local folder or .gguf file.", param="model") from None
    except LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:
            raise ModelNotFoundError(
                f"{repo_id} is not in {where}, and HF_HUB_OFFLINE=1 forbids downloading it; download it where the "
                f"network allows (hf download {repo_id}) or pass a local folder.", param="model") from None
        raise ModelNotFoundError(
            f"{repo_id} is not in {where}, and the Hugging Face Hub cannot be reached to download it; download it "
            f"where the network allows (hf download {repo_id}) or pass a local folder.", param="model") from None
    except HfHubHTTPError as err:
        raise ModelNotFoundError(f"Downloading {repo_id} from the Hugging Face Hub failed ({err}); retry, or pass "
                                 "a local folder.", param="model") from None
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(
            f"{repo_id} has no config.json (a repository of GGUF files?); download the .gguf you want (hf download "
            f"{repo_id} FILE.gguf) and pass its path to --model.", param="model")
    return folder


def hub_id_of(folder: Path) -> str | None:
    """``org/name`` for a snapshot folder of the Hugging Face cache (``models--org--name/snapshots/<rev>``), so a
    model opened by its cached path still reports its hub id; None for any other folder."""
    repo = folder.parent.parent.name
    if folder.parent.name != "snapshots" or not repo.startswith("models--"):
        return None
    return repo.removeprefix("models--").replace("--", "/", 1)
