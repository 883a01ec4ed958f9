"""Problems for training and evaluation: typed specs, built-in sources, files, prompts, batching."""

from orchestrator.data.config import (
    BUILTIN_SOURCES,
    ArithmeticOptions,
    DataConfig,
    DatasetSpec,
    PromptTemplateConfig,
    ReasoningGymOptions,
)
from orchestrator.data.files import DataFileError, save_problems
from orchestrator.data.loading import load_dataset
from orchestrator.data.prompts import chat_messages, format_prompt, prompt_token_ids
from orchestrator.data.sampler import PromptSampler

__all__ = [
    "BUILTIN_SOURCES",
    "ArithmeticOptions",
    "DataConfig",
    "DataFileError",
    "DatasetSpec",
    "PromptSampler",
    "PromptTemplateConfig",
    "ReasoningGymOptions",
    "chat_messages",
    "format_prompt",
    "load_dataset",
    "prompt_token_ids",
    "save_problems",
]
