import pytest

from workers.problem import Problem
from workers.reward.choice_verifier import chosen_option, verify_choice
from workers.reward.results import CheckError


def _choice(answer: str) -> Problem:
    return Problem(id="mc-1", prompt="Which one? (A) … (D) …", answer=answer, domain="choice")


@pytest.mark.parametrize(
    ("completion", "letter"),
    [
        ("Answer: C", "C"),
        ("The answer is (C).", "C"),
        ("the correct answer is c", "C"),
        ("I think it's (B)... no, (C)", "C"),
        ("\\boxed{C}", "C"),
        ("\\boxed{(C)}", "C"),
        ("\\boxed{\\text{C}}", "C"),
        ("Option A is wrong, B too. So C", "C"),
        ("C. I hope this helps", "C"),  # "I" followed by a word is the pronoun
        ("After checking, J", "J"),
        ("Hmm.\nA cat would say D", "D"),
    ],
)
def test_finds_the_chosen_letter(completion, letter):
    assert chosen_option(completion) == letter
    assert verify_choice(completion, _choice(letter)) == 1.0


@pytest.mark.parametrize("completion", ["Answer: B", "(A)", "\\boxed{D}", "no letter here", "", "ABC"])
def test_other_or_no_letter_scores_zero(completion):
    assert verify_choice(completion, _choice("C")) == 0.0


def test_reference_in_parentheses_is_accepted():
    assert verify_choice("Answer: C", _choice("(C)")) == 1.0


def test_bad_reference_is_an_error():
    with pytest.raises(CheckError, match="one letter"):
        verify_choice("Answer: C", _choice("C and D"))
