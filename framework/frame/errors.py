"""The one small family of user-facing errors.

Every mistake a user can make (an unknown plugin, a bad config key, a prompt too long, a bad sampling value)
raises a :class:`FrameUsageError` subclass whose message is one sentence that names the fix. The CLI prints it
as one line without a traceback; the server answers it in the OpenAI error shape with ``status``.
"""

from __future__ import annotations


class FrameUsageError(Exception):
    """A mistake the user can fix; ``str(err)`` is one sentence that says how.

    ``status`` is the HTTP status the server answers with, ``param`` the offending request field (or None),
    ``code`` a short machine-readable tag.
    """

    status: int = 400
    code: str = "invalid_request"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class ConfigError(FrameUsageError):
    """A configuration key is unknown, mistyped or out of range."""

    code = "invalid_config"


class PluginError(FrameUsageError):
    """Base of the plugin errors: the plugin asked for cannot be used."""

    code = "plugin_error"


class UnknownPluginError(PluginError):
    """No installed plugin of that kind has that name."""

    code = "unknown_plugin"


class PluginImportError(PluginError):
    """The plugin's module failed to import; the message names the wheel and the cause."""

    code = "plugin_import_failed"


class PluginUnavailableError(PluginError):
    """The plugin is installed but cannot run on this machine."""

    code = "plugin_unavailable"


class IncompatiblePluginError(PluginError):
    """The plugin was written for a plugin API version this core does not implement."""

    code = "incompatible_plugin"


class InvalidSamplingError(FrameUsageError):
    """A sampling parameter is out of range or of the wrong kind."""

    code = "invalid_sampling_params"


class PromptTooLongError(FrameUsageError):
    """The prompt plus the requested new tokens do not fit the model's context."""

    code = "context_length_exceeded"


class ModelNotFoundError(FrameUsageError):
    """The model path does not exist or is not a model frame can read."""

    status = 404
    code = "model_not_found"


class UnsupportedModelError(FrameUsageError, ValueError):
    """The checkpoint asks for something the chosen model family or attention backend does not implement (a rope
    type, a sliding window, a ``quantization_config``); the message names the config field. A ValueError too, so
    that code written against a family's earlier ValueErrors still catches it."""

    code = "unsupported_model"
