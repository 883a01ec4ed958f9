"""The worked-addition task: long answers, the right roles for every character, exact-match reward."""

from __future__ import annotations

import random

import pytest

from orchestrator.data.arithmetic import arithmetic_problems
from orchestrator.data.config import ArithmeticOptions
from orchestrator.data.worked_addition import DECISION_ROLES, roles_of, worked_answer
from workers.models.char_tokenizer import CHARACTERS
from workers.reward.arithmetic_verifier import verify_arithmetic


def test_a_known_sum_written_out_with_its_roles() -> None:
    answer, roles = worked_answer(347, 285, 3)
    assert answer == "7+5=12 4+8+1=13 3+2+1=6 632"
    assert roles == "ofoc" "dd" "f" "ofocff" "dd" "f" "ofocff" "d" "f" "aaa"
    answer, roles = worked_answer(120, 5, 3)
    assert answer == "0+5=5 2+0=2 1+0=1 125" and roles == "ofocd" "f" "ofocd" "f" "ofocd" "f" "aaa"


def _reference_roles(a: int, b: int, digits: int) -> str:
    """An independent labelling: which characters could differ between two problems sharing the prefix."""
    answer, _ = worked_answer(a, b, digits)
    out = []
    carry = 0
    for column in range(digits):
        x, y = a // 10**column % 10, b // 10**column % 10
        total = x + y + carry
        out += ["f"] if column else []
        out += ["o", "f", "o"] + (["c", "f", "f"] if carry else ["c"]) + ["d"] * len(str(total))
        carry = total // 10
    out += ["f"] + ["a"] * len(str(a + b))
    assert len(out) == len(answer)
    return "".join(out)


@pytest.mark.parametrize("digits", [1, 2, 3])
def test_every_problem_is_long_labelled_and_in_the_tiny_vocabulary(digits: int) -> None:
    rng = random.Random(digits)
    for _ in range(300):
        a, b = rng.randrange(10**digits), rng.randrange(10**digits)
        answer, roles = worked_answer(a, b, digits)
        assert len(roles) == len(answer) and set(answer) <= set(CHARACTERS)
        assert roles == _reference_roles(a, b, digits) == roles_of(answer, digits)
        assert answer.endswith(" " + str(a + b))
        if digits == 3:
            assert len(answer) + 1 >= 20  # with the end token
    # A decision changes what follows; a forced character never needs one: the answer is a function of the
    # prompt and the decision characters alone.


def test_decisions_are_what_distinguishes_answers_with_the_same_operand_digits() -> None:
    # Same digits in the same places, different carries: only decision characters (and the answer copy) differ.
    one, roles_one = worked_answer(15, 15, 2)   # 5+5=10 1+1+1=3 30
    two, roles_two = worked_answer(14, 15, 2)   # 4+5=9 1+1=2 29
    assert one == "5+5=10 1+1+1=3 30" and two == "4+5=9 1+1=2 29"
    decisions = sum(role in DECISION_ROLES for role in roles_one)
    assert decisions == 5 and 0.2 <= decisions / (len(roles_one) + 1) <= 0.3


def test_roles_of_a_policys_completion_follow_its_own_text() -> None:
    # A wrong digit in a digit's place is still a decision; leaving the grammar turns the rest to x.
    assert roles_of("7+5=13 4+8+1=13 3+2+1=6 632", 3) == roles_of("7+5=12 4+8+1=13 3+2+1=6 632", 3)
    assert roles_of("7+5=12 4*8", 3) == "ofocdd" "f" "o" "xx"
    assert roles_of("", 3) == ""


def test_worked_problems_split_like_the_equations_and_pay_only_the_exact_text() -> None:
    options = ArithmeticOptions(style="worked", digits=3)
    test = arithmetic_problems(options, "test", 50, seed=0)
    train = arithmetic_problems(options, "train", 200, seed=0)
    assert not {p.id for p in test} & {p.id for p in train}
    problem = test[0]
    a, b = problem.metadata["operands"]
    assert problem.prompt == f"{a:03d}+{b:03d}=" and problem.metadata["roles"] == worked_answer(a, b, 3)[1]
    assert verify_arithmetic(problem.answer, problem) == 1.0
    assert verify_arithmetic(problem.answer + "  ", problem) == 1.0
    final = problem.answer.rsplit(" ", 1)[1]
    for forged in (final, f"{final} {problem.answer}", problem.answer + " 1", problem.answer[:-1],
                   problem.answer.replace(" ", "  ", 1), " " + problem.answer):
        assert verify_arithmetic(forged, problem) == 0.0, forged


def test_worked_style_is_addition_only() -> None:
    with pytest.raises(ValueError, match="operations"):
        ArithmeticOptions(style="worked", operations=("+", "*"))


def _rollouts(tokenizer, problems, completions, eos=True):
    from orchestrator.rollout_ahead import Rollouts
    from workers.rollout.engine import RolloutSample

    samples = [RolloutSample(prompt_index=i, prompt_ids=[tokenizer.bos_token_id],
                             response_ids=tokenizer.encode(text) + ([tokenizer.eos_token_id] if eos else []),
                             response_logprobs=[], finish_reason="stop") for i, text in enumerate(completions)]
    return Rollouts(samples=samples, problems=list(problems), group_ids=list(range(len(samples))))


def test_the_driver_labels_every_token_of_a_character_tokenizer() -> None:
    from orchestrator.data.worked_addition import ROLE_IDS
    from orchestrator.rl_step import WORKED_ROLES, token_roles
    from workers.models.char_tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    worked = arithmetic_problems(ArithmeticOptions(style="worked", digits=3), "train", 2, seed=0)
    plain = arithmetic_problems(ArithmeticOptions(digits=2), "train", 1, seed=0)
    sampled = "7+5=12 4+8+1=1"  # a policy's answer cut short, then a wrong character
    rollouts = _rollouts(tokenizer, [*worked, plain[0], worked[1]],
                         [worked[0].answer, sampled + "*9", "12", "  "])
    roles, legend = token_roles(rollouts, tokenizer)
    assert legend == WORKED_ROLES and legend.names == tuple(ROLE_IDS)
    assert {legend.names[i] for i in legend.decisions} == DECISION_ROLES
    as_text = lambda ids: "".join(legend.names[i] for i in ids)
    assert as_text(roles[0]) == worked[0].metadata["roles"] + "f"  # the end token is format
    assert as_text(roles[1]) == roles_of(sampled + "*9", 3) + "f" and as_text(roles[1]).endswith("xxf")
    assert roles[2] == []  # not a worked problem: no roles
    assert as_text(roles[3]) == "xxf"
    assert [len(r) for r in roles] == [len(s.response_ids) if r else 0 for s, r in zip(rollouts.samples, roles)]
    assert token_roles(_rollouts(tokenizer, plain, ["12"]), tokenizer) is None


def test_a_tokenizer_of_several_characters_a_token_gives_no_roles() -> None:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    from orchestrator.rl_step import token_roles

    worked = arithmetic_problems(ArithmeticOptions(style="worked", digits=3), "train", 20, seed=0)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([p.answer for p in worked] * 5, vocab_size=300, min_frequency=2,
                            special_tokens=["<eos>"])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>", bos_token="<eos>")
    rollouts = _rollouts(tokenizer, worked[:2], [worked[0].answer, worked[1].answer])
    assert any(len(tokenizer.decode([i])) > 1 for i in rollouts.samples[0].response_ids)  # e.g. "12" as one token
    assert token_roles(rollouts, tokenizer) is None
