"""Turn a verifier's output into a per-assertion report, and that report into a reward.

Everything here is a pure function of its arguments: no files are read, nothing is run.

Which output is graded (`select_report`): the first source present wins, in this order (report
files always rank above the verifier's output, which the agent's programs can print into):
    1. `ctrf.json` (CTRF JSON, e.g. from pytest-json-ctrf or the termgym assertion kit)
    2. JUnit `*.xml` files, all of them, sorted by name and aggregated
    3. TAP `*.tap` files, all of them, sorted by name and aggregated
    4. `reward.json`, then 5. `reward.txt` (Harbor style; binary: reward >= 1.0 passes)
    6. the pytest `-rA` short test summary in the verifier's output (Terminal-Bench 1 style)
    7. the verifier's exit code (binary: 0 passes)
A task that declares its report format is graded from that source alone. A source that is present
but unusable (malformed, unsafe XML, over `MAX_REPORT_BYTES`) gives a report with no assertions and
`error` set, never a later source and never an exception. `check_assertion_count` holds a report
to the number of assertions the task's verifier defines (more is an error; fewer count as failed).

The reward (`compute_reward`): 0.0 for a report with an error; 1.0 or 0.0 for binary reports
(resolved or not); otherwise `passed / scale` (`DEFAULT_SCALE` = 20), which is not capped at 1
and is not a pass ratio: each passing assertion is worth 1/scale; skipped ones count neither way.
"""

from .ctrf import parse_ctrf
from .junit import parse_junit
from .pytest_summary import parse_pytest_summary
from .report import Assertion, AssertionReport, ReportFormat, ReportParseError, Status
from .reward import DEFAULT_SCALE, compute_reward
from .reward_files import from_exit_code, parse_reward_json, parse_reward_txt
from .select import (
    MAX_REPORT_BYTES,
    check_assertion_count,
    report_format_of,
    select_report,
    too_many_files_report,
)
from .tap import parse_tap

__all__ = [
    "DEFAULT_SCALE",
    "MAX_REPORT_BYTES",
    "Assertion",
    "AssertionReport",
    "ReportFormat",
    "ReportParseError",
    "Status",
    "check_assertion_count",
    "compute_reward",
    "from_exit_code",
    "parse_ctrf",
    "parse_junit",
    "parse_pytest_summary",
    "parse_reward_json",
    "parse_reward_txt",
    "parse_tap",
    "report_format_of",
    "select_report",
    "too_many_files_report",
]
