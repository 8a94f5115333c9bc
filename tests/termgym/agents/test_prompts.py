"""Observations: the status first, the output cut head and tail with the elided amount said."""

from __future__ import annotations

from termgym.agents.prompts import cut_chars, cut_token_ids, observation, resume_prompt, system_prompt


def test_observation_leads_with_the_status():
    assert observation("a\n", 0, False, max_chars=100) == "Exit code: 0\na\n"
    assert observation("", 2, False, max_chars=100) == "Exit code: 2\n(no output)"
    assert observation("partial", None, True, max_chars=100).startswith("The command timed out")


def test_long_output_keeps_head_and_tail_and_says_how_much_went():
    text = "H" * 600 + "M" * 1000 + "T" * 400
    cut = cut_chars(text, 1000)
    assert cut.startswith("H" * 500 + "\n") and cut.endswith("\n" + "M" * 100 + "T" * 400)
    assert "[... 1000 characters elided ...]" in cut
    assert cut_chars("short", 10) == "short"


def test_token_cut_keeps_first_and_last_ids():
    ids = list(range(100))
    cut = cut_token_ids(ids, 10, lambda part: ",".join(map(str, part)))
    assert cut == "0,1,2,3,4\n[... 90 tokens elided ...]\n95,96,97,98,99"
    assert cut_token_ids(ids, 100, str) is None


def test_the_token_cut_applies_after_the_character_cut():
    seen = []
    observation("x" * 50, 0, False, max_chars=20, cut_tokens=lambda text: seen.append(text) or "cut")
    assert len(seen) == 1 and "elided" in seen[0]


def test_prompts_name_the_finish_action_of_their_format():
    assert "`submit` tool" in system_prompt("tool")
    assert ":submit" in system_prompt("text")
    assert resume_prompt("Do X.", "/app", "found Y").endswith("found Y")
