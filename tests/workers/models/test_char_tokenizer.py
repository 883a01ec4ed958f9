import pytest
from transformers import AutoTokenizer

from workers.models.char_tokenizer import CHARACTERS, VOCAB, build_char_tokenizer, save_char_tokenizer


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
