"""Tests for gemma_grpo.tasks.rewards: every tier by table, totality by hypothesis.

Expected rewards are written out by hand from the rules in the module
docstring; none is computed by the code under test.
"""

from concurrent import futures
import inspect
import math
import types

from hypothesis import HealthCheck, given, settings, strategies as st
import pytest

from gemma_grpo import errors
from gemma_grpo.config import settings as settings_lib
from gemma_grpo.tasks import answers
from gemma_grpo.tasks import rewards


def ans(text: str) -> str:
  """A perfectly formatted completion whose <answer> holds `text`."""
  return f"<reasoning>Some steps.</reasoning>\n<answer>{text}</answer>"


def score(fn, completion, gold):
  [value] = fn(["prompt"], [completion], [gold])
  return value


@pytest.mark.parametrize("completion, expected", [
    (ans("42"), 3.0),
    (ans("42") + "<end_of_turn>", 3.0),
    (ans("42") + "<end_of_turn>\n<eos>\n", 3.0),
    ("\n <reasoning>r</reasoning><answer>42</answer> \n", 3.0),
    (ans("42") + " Hope this helps!", 0.0),
    ("<reasoning>r</reasoning> Thus: <answer>42</answer>", 0.0),
    ("<answer>42</answer>", 0.0),                          # missing reasoning
    ("<reasoning>r</reasoning>\n<answer>42", 0.0),         # unclosed
    ("<reasoning>r<reasoning>s</reasoning>\n<answer>42</answer>", 0.0),
    (ans("42") + "\n<answer>43</answer>", 0.0),            # repeated
    ("<answer>42</answer>\n<reasoning>r</reasoning>", 0.0),  # swapped
    ("", 0.0),
    (None, 0.0),
])
def test_format_exact(completion, expected):
  assert score(rewards.format_exact, completion, "42") == expected


@pytest.mark.parametrize("completion, expected", [
    (ans("42"), 2.0),
    ("<answer>42</answer><reasoning>r</reasoning>", 2.0),   # order is free
    ("<reasoning>r</reasoning><answer>42", 1.0),            # one missing
    ("<answer>42</answer>", 0.0),                           # two missing
    ("<answer>42", -1.0),
    (ans("42") + "<answer>43</answer>", 0.0),               # two repeated
    (ans("1") + ans("2"), -2.0),                            # all repeated
    ("<reasoning><reasoning></reasoning></reasoning>", -2.0),
    ("no tags at all", -2.0),
    ("", -2.0),
    (None, -2.0),
])
def test_format_approx(completion, expected):
  assert score(rewards.format_approx, completion, "42") == expected


@pytest.mark.parametrize("completion, gold, expected", [
    # Exact text, stripped text.
    (ans("72"), "72", 3.0),
    (ans("1,234"), "1,234", 3.0),
    (ans("-3"), "-3", 3.0),
    (ans(" 72 "), "72", 1.5),
    (ans("\n72\n"), "72", 1.5),
    ("<answer>72", "72", 3.0),                        # unclosed: text is "72"
    (ans("72"), 72, 3.0),                             # an int gold
    # Numerically equal in other words: the 1.5 tier.
    (ans("72.0"), "72", 1.5),
    (ans("$72"), "72", 1.5),
    (ans("72 dollars"), "72", 1.5),
    (ans("72%"), "72", 1.5),
    (ans("The answer is 72."), "72", 1.5),
    (ans("6 * 12 = 72"), "72", 1.5),                  # the last number
    (ans("\\boxed{72}"), "72", 1.5),
    (ans("٧٢"), "72", 1.5),
    (ans("7.2e1"), "72", 1.5),
    (ans("1234"), "1,234", 1.5),
    (ans("$1,234"), "1234", 1.5),
    (ans("1/2"), "0.5", 1.5),
    (ans("\\frac{1}{2}"), "0.5", 1.5),
    (ans("−3"), "-3", 1.5),
    ("<answer>72<end_of_turn>", "72", 1.5),
    ("<answer><answer>72</answer></answer>", "72", 1.5),
    ("<answer>" + "x" * 100_000 + " 72</answer>", "72", 1.5),
    # Partial credit by ratio guess / gold.
    (ans("22"), "20", 0.5),                           # 1.1
    (ans("18"), "20", 0.5),                           # 0.9
    (ans("73"), "72", 0.5),
    (ans("19.8"), "18", 0.5),                         # 1.1 up to rounding
    (ans("24"), "20", 0.25),                          # 1.2
    (ans("16"), "20", 0.25),                          # 0.8
    (ans("23"), "20", 0.25),
    (ans("25"), "20", -1.0),
    (ans("15"), "20", -1.0),
    (ans("0"), "20", -1.0),
    (ans("-20"), "20", -1.0),
    (ans("72 or 75"), "72", 0.5),                     # a hedge reads 75
    # Negative golds: ratios of same-sign numbers.
    (ans("-11"), "-10", 0.5),
    (ans("-9"), "-10", 0.5),
    (ans("-12"), "-10", 0.25),
    (ans("-13"), "-10", -1.0),
    (ans("10"), "-10", -1.0),
    (ans("-3.0"), "-3", 1.5),
    # Gold 0: no ratio, only an equal number counts.
    (ans("0"), "0", 3.0),
    (ans("0.0"), "0", 1.5),
    (ans("-0"), "0", 1.5),
    (ans("0.01"), "0", -1.0),
    (ans("1"), "0", -1.0),
    # No number in the answer.
    (ans("seventy-two"), "72", -0.5),
    (ans(""), "72", -0.5),
    (ans("nan"), "72", -0.5),
    (ans("inf"), "72", -0.5),
    (ans("1e999"), "72", -0.5),
    # No <answer> tag.
    ("72", "72", 0.0),
    ("<reasoning>72</reasoning>", "72", 0.0),
    ("", "72", 0.0),
    (None, "72", 0.0),
    # A gold without a number carries no signal unless matched as text.
    (ans("72"), "seventy-two", 0.0),
    (ans("abc"), "abc", 3.0),
    (ans(""), "", 0.0),
    (ans("72"), None, 0.0),
])
def test_answer_correct(completion, gold, expected):
  assert score(rewards.answer_correct, completion, gold) == expected


@pytest.mark.parametrize("completion, gold, expected", [
    (ans("72"), "72", 1.5),
    ("<answer>72", "72", 1.5),                        # unclosed
    ("<answer>72 apples</answ", "72", 1.5),           # broken closing tag
    ("<reasoning>r<answer>72</answer>", "72", 1.5),   # broken reasoning
    (ans("72.0"), "72", 1.5),
    (ans("$1,234"), "1234", 1.5),
    (ans("−3"), "-3", 1.5),
    (ans("0"), "0", 1.5),
    (ans("72 or 75"), "72", 1.5),                     # the first number
    (ans("6 * 12 = 72"), "72", 0.0),
    (ans("73"), "72", 0.0),
    (ans("x"), "72", 0.0),
    ("72", "72", 0.0),                                # no <answer> tag
    (ans("72"), None, 0.0),
    (None, "72", 0.0),
])
def test_number_match(completion, gold, expected):
  assert score(rewards.number_match, completion, gold) == expected


@pytest.mark.parametrize("completion, gold, expected", [
    (ans("\\frac{3}{4}"), "\\frac{3}{4}", 3.0),
    (ans("0.75"), "\\frac{3}{4}", 3.0),
    (ans("\\boxed{18}"), "18", 3.0),
    (ans("1,234"), "1234", 3.0),
    ("Therefore the answer is $\\boxed{\\sqrt{2}}$.", "\\sqrt{2}", 3.0),
    (ans("17"), "18", 0.0),
    (ans("\\boxed{2^{2^{2^{2^{2}}}}}"), "2", 0.0),
    (None, "18", 0.0),
])
def test_math_verify_correct(completion, gold, expected):
  assert score(rewards.math_verify_correct, completion, gold) == expected


def test_math_verify_correct_from_a_worker_thread():
  with futures.ThreadPoolExecutor(max_workers=1) as pool:
    got = pool.submit(rewards.math_verify_correct, None,
                      [ans("\\frac{1}{2}"), ans("3")], ["0.5", "4"]).result()
  assert got == [3.0, 0.0]


@pytest.mark.parametrize("completion, gold, expected", [
    (ans("72"), "72", dict(answer="72", number=72.0, grade="exact",
                           correct=True, partial=True, exact_format=True)),
    ("<answer>$72", "72", dict(answer="$72", number=72.0, grade="equal",
                               correct=True, partial=True,
                               exact_format=False)),
    (ans("75"), "72", dict(answer="75", number=75.0, grade="close",
                           correct=False, partial=True, exact_format=True)),
    (ans("85"), "72", dict(answer="85", number=85.0, grade="near",
                           correct=False, partial=False, exact_format=True)),
    ("no tag 72", "72", dict(answer=None, number=None, grade="no_answer",
                             correct=False, partial=False,
                             exact_format=False)),
])
def test_score_completion(completion, gold, expected):
  assert rewards.score_completion(completion, gold) == expected
  assert rewards.is_correct(completion, gold) is expected["correct"]
  assert rewards.is_partially_correct(completion, gold) is expected["partial"]
  assert answers.has_exact_format(completion) is expected["exact_format"]


def test_batch_pairs_each_completion_with_its_gold():
  got = rewards.answer_correct(["p"] * 3, [ans("1"), ans("2"), ans("3")],
                               ["1", "2", "30"], mode="train", question=["q"])
  assert got == [3.0, 3.0, -1.0]


@pytest.mark.parametrize("completions, answer, expected", [
    (ans("5"), "5", [3.0]),                 # a bare string is one completion
    ([ans("5"), ans("9")], "5", [3.0, -1.0]),  # a single gold is shared
    ([ans("5"), ans("9")], ["5"], [3.0, -1.0]),
    ([ans("5"), ans("6"), ans("7")], ["5", "6"], [3.0, 3.0, 0.0]),  # no gold
    ([ans("5")], ["5", "6"], [3.0]),
    ([], ["5"], []),
    (None, ["5"], []),
    ([ans("5"), 5, None, b"5"], None, [0.0, 0.0, 0.0, 0.0]),
])
def test_batch_shapes(completions, answer, expected):
  assert rewards.answer_correct(None, completions, answer) == expected


def total(fns, completion, gold) -> float:
  return sum(score(fn, completion, gold) for fn in fns)


def test_registry_names_become_tensorboard_keys():
  assert list(rewards.REWARD_FUNCTIONS) == [
      "format_exact", "format_approx", "answer_correct", "number_match",
      "math_verify_correct", "tool_errors"]
  for name, fn in rewards.REWARD_FUNCTIONS.items():
    assert fn.__name__ == name
    assert "<answer>" in fn.__doc__


@pytest.mark.parametrize("preset, weights, expected", [
    # Raw scores of ans("72") against "72": 3.0, 2.0, 3.0, 1.5, 3.0.
    ("reference", {}, {"format_exact": 3.0, "format_approx": 2.0,
                       "answer_correct": 3.0, "number_match": 1.5}),
    ("guarded", None, {"format_exact": 1.5, "format_approx": 1.0,
                       "answer_correct": 15.0, "number_match": 0.75}),
    ("math", {}, {"format_exact": 0.3, "format_approx": 0.2,
                  "math_verify_correct": 3.0}),
    ("guarded", {"number_match": 0.0, "format_exact": None},
     {"format_exact": 1.5, "format_approx": 1.0, "answer_correct": 15.0}),
    ("reference", {"answer_correct": -2, "math_verify_correct": 0.5},
     {"format_exact": 3.0, "format_approx": 2.0, "answer_correct": -6.0,
      "number_match": 1.5, "math_verify_correct": 1.5}),
])
def test_build_reward_fns(preset, weights, expected):
  fns = rewards.build_reward_fns(preset, weights)
  got = {fn.__name__: score(fn, ans("72"), "72") for fn in fns}
  assert got == pytest.approx(expected, abs=1e-12)


def test_weights_from_the_read_only_mapping_the_settings_hold():
  weights = types.MappingProxyType({"number_match": 0.0, "format_exact": None})
  fns = rewards.build_reward_fns("guarded", weights)
  assert [fn.__name__ for fn in fns] == [
      "format_exact", "format_approx", "answer_correct"]


def test_weighted_fns_keep_the_signature_tunix_inspects():
  [fn] = rewards.build_reward_fns("reference", {
      "format_exact": 0, "format_approx": 0, "number_match": 0})
  assert list(inspect.signature(fn).parameters) == [
      "prompts", "completions", "answer", "kwargs"]


def test_guarded_is_the_default():
  assert [fn.__name__ for fn in rewards.build_reward_fns()] == [
      "format_exact", "format_approx", "answer_correct", "number_match"]


@pytest.mark.parametrize("preset, weights, field", [
    ("greedy", {}, "rewards.preset"),
    ("guarded", {"format_exakt": 1.0}, "rewards.weights.format_exakt"),
    ("guarded", {"format_exakt": None}, "rewards.weights.format_exakt"),
    ("guarded", {"format_exact": float("nan")}, "rewards.weights.format_exact"),
    ("guarded", {"format_exact": "1"}, "rewards.weights.format_exact"),
    ("math", {"math_verify_correct": 0, "format_exact": 0,
              "format_approx": 0}, "rewards.weights"),
])
def test_build_reward_fns_rejects_bad_config(preset, weights, field):
  with pytest.raises(ValueError) as error:
    rewards.build_reward_fns(preset, weights)
  message = str(error.value)
  assert message.startswith(field + ":") and "\n" not in message
  assert "format_exact" in message or "guarded" in message  # lists choices


# --- Totality: any input gives one finite float per completion --------------

_TAG_SOUP = st.lists(
    st.sampled_from(["<reasoning>", "</reasoning>", "<answer>", "</answer>",
                     "<end_of_turn>", "<eos>", "72", "-", "−", "1,234", "3/4",
                     "\\frac{1}{2}", "\\boxed{", "}", "٣", "$", "%", "1e999",
                     "nan", "inf", "0", " ", "\n"]) | st.text(max_size=5),
    max_size=30).map("".join)
_HUGE = st.builds(lambda chunk, n: (chunk * (100_000 // len(chunk) + 1))[:n],
                  st.text(min_size=1, max_size=8) | _TAG_SOUP.filter(bool),
                  st.integers(50_000, 100_000))
_COMPLETION = st.one_of(st.text(), _TAG_SOUP, _HUGE, st.none(), st.integers(),
                        st.floats(), st.binary(max_size=8))
_GOLD = st.one_of(st.text(max_size=8), st.integers(), st.floats(), st.none(),
                  st.sampled_from(["72", "-3", "1,234", "0.5", "0", "nan"]))
_FAST = [fn for name, fn in rewards.REWARD_FUNCTIONS.items()
         if name != "math_verify_correct"]
_PRESETS = [rewards.build_reward_fns(p, {}) for p in rewards.PRESETS]


def test_a_scorer_bug_costs_one_score_not_the_step(caplog):
  def broken(completion, gold):
    return 1 / len(completion)

  got = rewards._score_batch(broken, ["ab", "", "abcd"], None)  # pylint: disable=protected-access
  assert got == [0.5, 0.0, 0.25]
  assert "broken raised ZeroDivisionError" in caplog.text


def _check_total(fn, completions, golds, caplog):
  got = fn(["p"] * len(completions), completions, golds, mode="train")
  assert isinstance(got, list) and len(got) == len(completions)
  assert all(type(r) is float and math.isfinite(r) for r in got)
  # The per-completion safety net in rewards logs when it catches a bug.
  assert not [r for r in caplog.records if r.name == rewards.__name__]


@settings(max_examples=500, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(completions=st.lists(_COMPLETION, max_size=10),
       golds=st.lists(_GOLD, max_size=10))
def test_rewards_are_total(completions, golds, caplog):
  for fn in _FAST + [f for fns in _PRESETS[:2] for f in fns]:
    _check_total(fn, completions, golds, caplog)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(completions=st.lists(_COMPLETION, max_size=2),
       golds=st.lists(_GOLD, max_size=2))
def test_math_rewards_are_total(completions, golds, caplog):
  # math-verify costs milliseconds per call: fewer, smaller batches.
  for fn in [rewards.math_verify_correct] + _PRESETS[2]:
    _check_total(fn, completions, golds, caplog)


# --- The guarded preset: correct beats wrong, whatever the format ----------

_REASONING = st.text(st.characters(blacklist_characters="<"), max_size=60)


def _spellings(n: int) -> list[str]:
  """Answer texts whose number, as the rules read it, is n."""
  sign = "-" if n < 0 else ""
  return [f"{n}", f" {n}\n", f"{n}.0", f"{sign}${abs(n):,}", f"{n} dollars",
          f"The answer is {n}.", f"\\boxed{{{n}}}",
          f"{sign}\\frac{{{2 * abs(n)}}}{{2}}",
          f"{n}".replace("-", "−"), f"5 then {n}"]


_WRAPPERS = [
    "<reasoning>{r}</reasoning>\n<answer>{a}</answer><end_of_turn>",
    "<answer>{a}</answer>",
    "{r} <answer>{a}",                                  # unclosed
    "<answer>{a}<answer></answer></answer>",            # every tag wrong
    "<answer>{a}</answer><reasoning>{r}</reasoning><reasoning>",
]


@settings(max_examples=300, deadline=None)
@given(gold=st.integers(-10**6, 10**6), reasoning=_REASONING,
       spelling=st.integers(0, 9), wrapper=st.integers(0, 4),
       delta=st.integers(-10**6, 10**6).filter(bool), hedge=st.booleans())
def test_guarded_correct_beats_any_wrong(gold, reasoning, spelling, wrapper,
                                         delta, hedge):
  guarded = rewards.build_reward_fns("guarded", {})
  correct = _WRAPPERS[wrapper].format(r=reasoning, a=_spellings(gold)[spelling])
  # Small deltas land within 10% or 20% of large golds: partial credit.
  wrong_number = f"{gold} or {gold + delta}" if hedge else f"{gold + delta}"
  wrong = (f"<reasoning>{reasoning or 'r'}</reasoning>\n"
           f"<answer>{wrong_number}</answer>")
  assert total(guarded, correct, str(gold)) > total(guarded, wrong, str(gold))


# Hand-scored extremes of the bound in the rewards docstring, gold "72":
#   correct: "<answer>5 then 72<answer>": exact 0, approx -2 (answer twice,
#     three tags missing), answer 1.5 (reads 72), number 0 (first is 5).
#   wrong: perfect format with "72 or 75": exact 3, approx 2, answer 0.5
#     (75 / 72 = 1.04), number 1.5 (first is 72).
_WORST_CORRECT = "<answer>5 then 72<answer>"
_BEST_WRONG = ans("72 or 75")


@pytest.mark.parametrize("preset, correct, wrong", [
    ("guarded", 0.5 * 0 + 0.5 * -2 + 5 * 1.5 + 0.5 * 0,      # 6.5
     0.5 * 3 + 0.5 * 2 + 5 * 0.5 + 0.5 * 1.5),               # 5.75
    ("reference", 0 - 2 + 1.5 + 0, 3 + 2 + 0.5 + 1.5),      # -0.5 < 7.0
])
def test_bound_extremes(preset, correct, wrong):
  fns = rewards.build_reward_fns(preset, {})
  assert total(fns, _WORST_CORRECT, "72") == pytest.approx(correct)
  assert total(fns, _BEST_WRONG, "72") == pytest.approx(wrong)


def test_reference_preset_pays_for_format_over_correctness():
  # Even an exactly right answer in sloppy tags (3.0 + 1.5 - 2 = 2.5) loses to
  # a far-off answer in perfect format (3 + 2 - 1.0 + 0 = 4.0).
  sloppy_right = "<answer>72</answer><answer></answer>"
  tidy_wrong = ans("1000")
  reference = rewards.build_reward_fns("reference", {})
  assert total(reference, sloppy_right, "72") == 2.5
  assert total(reference, tidy_wrong, "72") == 4.0
  guarded = rewards.build_reward_fns("guarded", {})
  assert total(guarded, sloppy_right, "72") > total(guarded, tidy_wrong, "72")


def test_custom_rewards_are_loaded_by_import_path():
  fns = rewards.load_custom("toy_rewards:vowel_share")  # tests/ is on sys.path
  assert [f.__name__ for f in fns] == ["vowel_share"]
  assert fns[0]([""], ["aei xyz"], ["1"]) == [0.5]


@pytest.mark.parametrize("spec, needle", [
    ("no_colon", "is not 'module:function'"),
    ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
    ("toy_rewards:missing", "has no function 'missing'"),
    ("gemma_grpo.tasks.rewards:format_exact", "clashes with another reward named 'format_exact'"),
])
def test_bad_custom_rewards_name_the_field(spec, needle):
  with pytest.raises(ValueError, match="rewards.custom") as e:
    rewards.load_custom(spec)
  assert needle in str(e.value)


def _rewards_section(**fields) -> settings_lib.RewardSettings:
  return settings_lib.RewardSettings(**{"preset": "guarded", "custom": "", "weights": {}, **fields})


@pytest.mark.parametrize("fields, message", [
    ({"preset": "fancy"}, "rewards.preset: unknown preset 'fancy'"),
    ({"weights": {"format_exakt": 1.0}}, "rewards.weights.format_exakt: unknown reward function"),
    ({"custom": "no_colon"}, "rewards.custom: 'no_colon' is not 'module:function'"),
])
def test_check_is_one_user_error_line(fields, message):
  with pytest.raises(errors.UserError) as e:
    rewards.check(_rewards_section(**fields))
  assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_check_accepts_the_shipped_configs():
  from gemma_grpo import config  # pylint: disable=g-import-not-at-top
  rewards.check(settings_lib.from_config(config.defaults()).rewards)
  rewards.check(settings_lib.from_config(config.load("configs/gemma3_270m_tools.py")).rewards)


# --- tool_errors: -0.25 per result that is an error --------------------------

def call(expression: str, result: str) -> str:
  return (f"<tool_call>calculator: {expression}</tool_call>"
          f"<tool_result>{result}</tool_result>")


@pytest.mark.parametrize("completion, expected", [
    (ans("72"), 0.0),                                          # no calls
    (call("6 * 12", "72") + ans("72"), 0.0),
    (call("1/0", "error: division by zero") + ans("?"), -0.25),
    (call("1/0", "error: division by zero") + call("6 * 12", "72")
     + call("x", "error: unexpected 'x'") + ans("72"), -0.5),
    ("<tool_call>oops</tool_call><tool_result>error: malformed call", -0.25),  # cut off
    ("<tool_result> error: leading space</tool_result>", 0.0),  # not an error result
    ("<tool_call>calculator: 1/0</tool_call>", 0.0),            # no result: not run
    ("", 0.0),
    (None, 0.0),
])
def test_tool_errors(completion, expected):
  assert score(rewards.tool_errors, completion, "72") == expected


def test_tool_errors_is_in_no_preset_until_weighted():
  assert all("tool_errors" not in weights for weights in rewards.PRESETS.values())
  fns = rewards.build_reward_fns("guarded", {"tool_errors": 2.0})
  assert [fn.__name__ for fn in fns][-1] == "tool_errors"
  assert score(fns[-1], call("1/0", "error: division by zero"), "72") == -0.5
