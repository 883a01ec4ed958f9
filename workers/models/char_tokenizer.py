"""A character-level tokenizer for the tiny arithmetic model.

One id per character of ``0123456789+-*=`` and space, plus ``<pad>``, ``<bos>``, ``<eos>``. It is saved as
a real ``PreTrainedTokenizerFast`` (``tokenizer.json`` + ``tokenizer_config.json``) so that both
``transformers.AutoTokenizer`` and vLLM load it from the model folder with no custom code.

The tokenizer adds no special tokens on its own: ``encode("23+45=")`` is exactly six ids. Whoever builds
prompts decides whether to prepend ``bos_token_id``; the model learns the ``<eos>`` at the end of answers,
and vLLM stops on it because ``config.json``/``generation_config.json`` name it as ``eos_token_id``.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)
CHARACTERS = "0123456789+-*= "

# Special tokens first so that pad = 0, bos = 1, eos = 2 whatever the character set grows into.
VOCAB: dict[str, int] = {token: index for index, token in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer as a ``PreTrainedTokenizerFast``; unknown characters are an error.

    WordLevel over single characters: the pre-tokenizer isolates every character (spaces included, so
    that they survive as tokens), and the ``Fuse`` decoder joins tokens back without separators, which
    makes ``decode(encode(text)) == text``. vLLM's incremental detokenizer uses the same decoder.
    """
    # No unk token: a prompt with a character outside the vocabulary must fail loudly, not train on <unk>.
    backend = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )


def save_char_tokenizer(folder: Path) -> PreTrainedTokenizerFast:
    """Write the tokenizer files into ``folder`` (which must exist) and return the tokenizer."""
    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(folder)
    return tokenizer


def load_tokenizer(folder: str | Path) -> PreTrainedTokenizerFast:
    """The tokenizer of a model folder: ``AutoTokenizer``'s, except for a folder holding this character tokenizer.

    On a folder whose ``config.json`` says ``qwen2`` (the tiny model's), transformers forces Qwen2's tokenizer
    class whatever ``tokenizer_config.json`` names, and Qwen2's byte-level pre-tokenizer replaces ours: it drops
    the space (mapped outside the vocabulary) and groups runs of symbols. The character tokenizer is recognised by
    its vocabulary and loaded as the plain fast tokenizer its ``tokenizer.json`` describes."""
    tokenizer_file = Path(folder) / "tokenizer.json"
    # A character vocabulary is a few hundred bytes of JSON; a real one is megabytes and is never parsed here.
    if tokenizer_file.is_file() and tokenizer_file.stat().st_size < 16_384:
        if json.loads(tokenizer_file.read_text()).get("model", {}).get("vocab") == VOCAB:
            return PreTrainedTokenizerFast.from_pretrained(folder)
    # Imported for a real model's folder only: transformers' auto classes import every model's configuration
    # (2-4 s of one core), which the tiny model's runs, sweep trials and job drivers would pay for nothing.
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)
