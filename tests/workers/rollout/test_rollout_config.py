import pytest
from pydantic import ValidationError

from workers.rollout.actor import _contiguous_chunks
from workers.rollout.config import RolloutConfig


def test_max_model_len_fits_prompt_response_and_one_scoring_token():
    assert RolloutConfig(max_prompt_tokens=48, max_new_tokens=16).max_model_len == 65


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", 0.0), ("top_p", 1.5), ("top_k", -1), ("n_samples", 0), ("num_actors", 0)],
)
def test_invalid_values_are_reported_against_their_field(field, value):
    with pytest.raises(ValidationError) as error:
        RolloutConfig(**{field: value})
    assert [item["loc"] for item in error.value.errors()] == [(field,)]


@pytest.mark.parametrize(("num_items", "num_chunks"), [(10, 3), (2, 2), (1, 3), (0, 2), (7, 1)])
def test_prompts_split_into_contiguous_balanced_chunks(num_items, num_chunks):
    chunks = _contiguous_chunks(num_items, num_chunks)
    assert len(chunks) == num_chunks
    assert [i for start, stop in chunks for i in range(start, stop)] == list(range(num_items))
    sizes = [stop - start for start, stop in chunks]
    assert max(sizes) - min(sizes) <= 1
