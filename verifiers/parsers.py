"""All report parsers in one place; each lives in its own module.

Every `parse_*` function takes text (JUnit also accepts bytes) and returns an `AssertionReport`
or raises `ReportParseError` (a ValueError); `parse_pytest_summary` instead returns None when
the text has no pytest summary, and never raises.
"""

from verifiers.ctrf import parse_ctrf
from verifiers.junit import parse_junit
from verifiers.pytest_summary import parse_pytest_summary
from verifiers.report import ReportParseError
from verifiers.reward_files import from_exit_code, parse_reward_json, parse_reward_txt
from verifiers.tap import parse_tap

__all__ = [
    "ReportParseError",
    "from_exit_code",
    "parse_ctrf",
    "parse_junit",
    "parse_pytest_summary",
    "parse_reward_json",
    "parse_reward_txt",
    "parse_tap",
]
