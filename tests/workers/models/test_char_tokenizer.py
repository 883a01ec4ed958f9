import pytest
from transformers import AutoTokenizer

from workers.models.char_tokenizer import CHARACTERS, VOCAB, build_char_tokenizer, load_tokenizer, save_char_tokenizer


@pytest.fixture(scope="module")
def saved_tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("char_tokenizer")
    save_char_tokenizer(folder)
    return AutoTokenizer.from_pretrained(folder)


def test_vocabulary_is_the_characters_plus_three_special_tokens():
    assert len(VOCAB) == len(CHARACTERS) + 3 == 18
    tokenizer = build_char_tokenizer()
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert len(tokenizer) == 18


def test_one_id_per_character_and_no_implicit_special_tokens(saved_tokenizer):
    ids = saved_tokenizer("23+45=")["input_ids"]
    assert ids == [VOCAB[c] for c in "23+45="]


@pytest.mark.parametrize("text", ["23+45=68", "2 + 3 = 5", " 7*8-9 ", "0"])
def test_decode_round_trips(saved_tokenizer, text):
    ids = saved_tokenizer(text)["input_ids"]
    assert len(ids) == len(text)
    assert saved_tokenizer.decode(ids) == text


def test_eos_is_dropped_when_skipping_special_tokens(saved_tokenizer):
    ids = [saved_tokenizer.bos_token_id, *saved_tokenizer("12")["input_ids"], saved_tokenizer.eos_token_id]
    assert saved_tokenizer.decode(ids, skip_special_tokens=True) == "12"
    assert saved_tokenizer.decode(ids) == "<bos>12<eos>"


def test_characters_outside_the_vocabulary_raise(saved_tokenizer):
    with pytest.raises(Exception, match="UNK|unk"):
        saved_tokenizer("x=1")


def test_autotokenizer_on_a_model_folder_keeps_every_character(tmp_path):
    """Beside a Qwen2 ``config.json`` AutoTokenizer forces Qwen2's tokenizer class, whose byte-level
    pre-tokenizer drops spaces ("3+4=7 6" lost its space) and groups runs of symbols; ``load_tokenizer`` loads
    the character tokenizer the folder holds."""
    from transformers import Qwen2Config

    Qwen2Config(vocab_size=len(VOCAB)).save_pretrained(tmp_path)
    save_char_tokenizer(tmp_path)
    assert 17 not in AutoTokenizer.from_pretrained(tmp_path)("7 6", add_special_tokens=False)["input_ids"]
    tokenizer = load_tokenizer(tmp_path)
    for text in ("3+4=7 6+2=8 87", "1+-2", "  9 "):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids == [VOCAB[c] for c in text], text
        assert tokenizer.batch_decode([ids + [tokenizer.eos_token_id]], skip_special_tokens=True)[0] == text
