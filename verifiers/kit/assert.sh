# termgym assertion kit: per-assertion verifiers in plain POSIX sh, no Python needed in the image.
#
# Source it from a task's tests/test.sh (termgym uploads it with the tests; TERMGYM_ASSERT names it):
#
#     . "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"
#     tg_check "report exists"      test -f /app/report.txt
#     tg_check_sh "three lines"     '[ "$(wc -l < /app/report.txt)" -eq 3 ]'
#     tg_skip "optional part"       "not graded yet"
#     tg_finish
#
# Guarantees:
# - every assertion is recorded in CTRF JSON at $TG_REPORT (default /logs/verifier/ctrf.json),
#   rewritten atomically after each assertion, so a verifier killed half-way still leaves a valid
#   report of what it checked;
# - a check runs with stdin from /dev/null and its output is kept (last lines) as the failure message;
# - tg_finish exits 0 when every non-skipped assertion passed, 1 otherwise.
# Names and messages are escaped for JSON; control characters are dropped.

TG_REPORT=${TG_REPORT:-/logs/verifier/ctrf.json}
TG__ROWS=$(mktemp "${TMPDIR:-/tmp}/tg-rows.XXXXXX")
TG__OUT=$(mktemp "${TMPDIR:-/tmp}/tg-out.XXXXXX")
TG__START=$(date +%s%3N 2>/dev/null || echo 0)
TG__PASSED=0
TG__FAILED=0
TG__SKIPPED=0

tg__json() {
  # JSON string body: backslash and quote escaped, tabs and newlines as spaces, other controls dropped.
  printf '%s' "$1" | tr '\t\n\r' '   ' | tr -d '\000-\037' | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g'
}

tg__write() {
  tg__now=$(date +%s%3N 2>/dev/null || echo 0)
  mkdir -p "$(dirname "$TG_REPORT")"
  {
    printf '{"results":{"tool":{"name":"termgym-assert"},'
    printf '"summary":{"tests":%d,"passed":%d,"failed":%d,"skipped":%d,"pending":0,"other":0,"start":%s,"stop":%s},' \
      $((TG__PASSED + TG__FAILED + TG__SKIPPED)) "$TG__PASSED" "$TG__FAILED" "$TG__SKIPPED" "$TG__START" "$tg__now"
    printf '"tests":['
    sed -e '$!s/$/,/' "$TG__ROWS"
    printf ']}}\n'
  } > "$TG_REPORT.tmp" && mv -f "$TG_REPORT.tmp" "$TG_REPORT"
}

tg__record() {  # name status message
  printf '{"name":"%s","status":"%s","duration":0,"message":"%s"}\n' \
    "$(tg__json "$1")" "$2" "$(tg__json "$3")" >> "$TG__ROWS"
  case $2 in
    passed) TG__PASSED=$((TG__PASSED + 1)); printf 'ok      %s\n' "$1" ;;
    failed) TG__FAILED=$((TG__FAILED + 1)); printf 'FAILED  %s\n' "$1"; [ -n "$3" ] && printf '        %s\n' "$3" ;;
    *)      TG__SKIPPED=$((TG__SKIPPED + 1)); printf 'skipped %s (%s)\n' "$1" "$3" ;;
  esac
  tg__write
}

# tg_check NAME COMMAND [ARG...]: passes when COMMAND exits 0.
tg_check() {
  tg__name=$1; shift
  if "$@" < /dev/null > "$TG__OUT" 2>&1; then
    tg__record "$tg__name" passed ""
  else
    tg__record "$tg__name" failed "exit $?: $(tail -n 5 "$TG__OUT" | cut -c1-300)"
  fi
}

# tg_check_sh NAME 'SHELL SNIPPET': passes when the snippet, run by sh -c, exits 0.
tg_check_sh() {
  tg_check "$1" sh -c "$2"
}

# tg_skip NAME REASON: recorded as skipped; counts neither way.
tg_skip() {
  tg__record "$1" skipped "$2"
}

# tg_finish: write the final report, clean up, exit 0 if nothing failed.
tg_finish() {
  tg__write
  rm -f "$TG__ROWS" "$TG__OUT"
  printf '%d passed, %d failed, %d skipped\n' "$TG__PASSED" "$TG__FAILED" "$TG__SKIPPED"
  [ "$TG__FAILED" -eq 0 ] && exit 0
  exit 1
}

tg__write
