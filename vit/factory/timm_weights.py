"""timm's published weights for a model name: downloaded through timm, read from the Hugging
Face cache offline, or refused in one line when neither can be had."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

TIMM_WEIGHTS = "timm"  # --pretrained with no value: timm's published weights for the model name


class PretrainedUnavailableError(ConnectionError, RuntimeError):
    """timm's pretrained weights cannot be downloaded (offline, no network) and are not cached.

    A ConnectionError; also a RuntimeError, which the command lines report in one line.
    `model_name` and `reason` say which weights and why; the message advises passing a local
    file instead, spelt as `vit.create_model` takes it (see `advising` for a command's flag).
    """

    def __init__(self, model_name: str, reason: str, spelling: str = "pretrained=PATH") -> None:
        self.model_name, self.reason = model_name, reason
        super().__init__(
            f"cannot download the pretrained weights of {model_name}: {reason}, and they are "
            f"not in the Hugging Face cache; pass {spelling} to a local weights file instead"
        )

    def advising(self, spelling: str) -> str:
        """The message with another spelling of the advice, e.g. "--pretrained PATH"."""
        return str(PretrainedUnavailableError(self.model_name, self.reason, spelling))


def timm_pretrained(name: str, tag: str | None):
    """timm's pretrained model `name.tag` (timm downloads, caches and converts the weights).

    Offline (HF_HUB_OFFLINE set, or the hub unreachable) weights already in the Hugging Face
    cache are read from it; otherwise one line says so at once, instead of the hub client's
    retries.
    """
    if tag is None:
        raise ValueError(
            f"no published pretrained weights for {name}; pass pretrained=PATH to a weights file "
            f"(e.g. a run folder's model.safetensors)"
        )
    import timm  # imported here: only this path needs it

    full_name = f"{name}.{tag}"
    cached = _cached_timm_weights(full_name)
    if cached is not None:
        return timm.create_model(
            full_name, pretrained=True, pretrained_cfg_overlay={"file": cached}
        )
    offline = _hub_offline_reason()
    if offline:
        raise PretrainedUnavailableError(full_name, offline)
    return timm.create_model(full_name, pretrained=True)


def _cached_timm_weights(full_name: str) -> str | None:
    """The path of `full_name`'s weights in the Hugging Face cache, if they are there."""
    from huggingface_hub import try_to_load_from_cache
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(full_name)
    if cfg is None or not cfg.hf_hub_id:
        return None
    names = [cfg.hf_hub_filename] if cfg.hf_hub_filename else []
    for filename in names + ["model.safetensors", "pytorch_model.bin"]:
        path = try_to_load_from_cache(cfg.hf_hub_id, filename)
        if isinstance(path, str):
            return path
    return None


def _hub_offline_reason(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face hub cannot be reached, or None: HF_HUB_OFFLINE, or no connection
    to the hub (or the proxy) within `timeout` seconds."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    url = urlsplit(proxy or endpoint)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        return f"no network connection to {host}:{port} ({e})"
    return None


def pretrained_weights(value: str | None) -> bool | str:
    """A --pretrained value -> create_model's `pretrained`: no value means timm's weights; a
    train.py run folder means its model.safetensors, as every command's model argument."""
    if not value:
        return False
    if value in (TIMM_WEIGHTS, "true", "True"):
        return True
    weights = run_weights(Path(value))
    return str(weights) if weights != Path(value) else value


def run_weights(path: Path) -> Path:
    """A train.py run folder -> its model.safetensors; any other path as it is (a transformers
    folder holds a model.safetensors too, beside its config.json)."""
    weights = path / "model.safetensors"
    is_run = path.is_dir() and weights.is_file() and not (path / "config.json").exists()
    return weights if is_run else path
