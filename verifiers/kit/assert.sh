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
#   rewritten whole after each assertion, so a verifier killed half-way still leaves a valid report
#   of what it checked. The rewrite is one printf builtin in place (no process forked), and the kit
#   traps TERM, INT and HUP (exit 143, 130, 129), which the shell then handles only once a rewrite
#   has ended: the timeout's TERM never cuts a report. Only a SIGKILL in the instant of a rewrite
#   could, and termgym reads a cut report as no assertions: never more credit than was checked;
# - a check runs with stdin from /dev/null and its output is kept (last lines) as the failure message;
# - tg_finish exits 0 when every non-skipped assertion passed, 1 otherwise.
# Names and messages are escaped for JSON; tabs, newlines and carriage returns become spaces, other
# control characters are dropped, and so are bytes that are not valid UTF-8 (the report is always
# valid UTF-8 JSON, even when a check's output is binary or cut inside a character). A name or
# message is cut at 4096 bytes (a failure message holds at most 5 lines of 300 bytes anyway).
#
# Scratch and clock: the kit keeps each check's output in a scratch directory, TG_SCRATCH where the
# harness gives one (an empty directory made for this run that nothing else writes: termgym makes
# one and leaves it in place), else one from `mktemp -d` that tg_finish removes. The report's start
# time is TG_START_MS where the harness gives one (milliseconds since the epoch, as it launched the
# script), else the clock's when the kit is sourced; its stop time is the clock's in tg_finish.
#
# Cost: sourcing forks the subshell that prints the byte classes, `mktemp` without TG_SCRATCH and
# `date` without TG_START_MS; tg_finish forks `date`, and `rm` where the directory is its own.
# Under bash 5 no `date` is forked (its EPOCHREALTIME is the clock). Besides the check itself, an
# assertion forks none; a failing check with output forks two (`tail`, `cut`), a name or message
# over 4096 bytes three (to cut it). Escaping, the report text and the bookkeeping are shell
# builtins. summary.stop equals summary.start until tg_finish writes the end time.

TG_REPORT=${TG_REPORT:-/logs/verifier/ctrf.json}
if [ -n "${TG_SCRATCH-}" ] && [ -d "$TG_SCRATCH" ] && [ ! -L "$TG_SCRATCH" ] && [ -w "$TG_SCRATCH" ]; then
  TG__TMP=$TG_SCRATCH TG__OWN_TMP=
else
  TG__TMP=$(mktemp -d "${TMPDIR:-/tmp}/tg.XXXXXX") || {
    echo "assert.sh: cannot create a scratch directory in ${TMPDIR:-/tmp}" >&2
    exit 1
  }
  TG__OWN_TMP=1
fi
TG__OUT=$TG__TMP/out
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP
tg__ms() {  # sets tg__t to the milliseconds since the epoch, 0 if there is no date to tell
  case ${EPOCHREALTIME-} in  # bash 5's clock, read without a process (seconds, a point or comma, microseconds)
    [0-9]*[.,][0-9][0-9][0-9]*)
      tg__f=${EPOCHREALTIME#*[.,]}
      tg__t=${EPOCHREALTIME%%[.,]*}${tg__f%"${tg__f#???}"}
      case $tg__t in *[!0-9]*) ;; *) return 0 ;; esac
      ;;
  esac
  tg__t=$(date +%s%3N 2>/dev/null)
  case $tg__t in
    *[!0-9]*) tg__t=${tg__t%%[!0-9]*}; tg__t=${tg__t:+${tg__t}000} ;;  # busybox: no %N
  esac
  tg__t=${tg__t:-0}
}
case ${TG_START_MS-} in
  '' | *[!0-9]*) tg__ms ;;
  *) tg__t=$TG_START_MS ;;
esac
TG__START=$tg__t
TG__STOP=$tg__t
TG__PASSED=0
TG__FAILED=0
TG__SKIPPED=0
TG__ROWS=
TG__NL='
'
# Byte classes for the escaper, as bracket-expression bodies: made by the printf builtin and
# evaluated, so that the kit itself stays ASCII. Never through a file: a file the kit sources is a
# file something else could have written.
eval "$(printf "TG__WS='\011\012\015' TG__CTL='\001-\037' TG__HI='\200-\377' TG__CB='\200-\277'
TG__U2='\302-\337' TG__E0='\340' TG__A0='\240-\277' TG__U3='\341-\354\356\357' TG__ED='\355'
TG__X9F='\200-\237' TG__F0='\360' TG__X90='\220-\277' TG__U4='\361-\363' TG__F4='\364' TG__X8F='\200-\217'
")"

tg__json() {
  # Sets tg__j to the JSON string body of $1: backslash and quote escaped, tab/newline/CR as spaces,
  # other controls and invalid UTF-8 bytes dropped. Plain strings cost one pattern match. Patterns
  # match bytes: LC_ALL=C for the while (a shell with locales, e.g. bash, would match characters).
  tg__lc=${LC_ALL-} tg__lcset=${LC_ALL+1}
  LC_ALL=C
  tg__s=$1
  if [ "${#tg__s}" -gt 4096 ]; then  # rare: cut by a process, so escaping stays cheap
    tg__s=$(printf '%s' "$tg__s" | head -c 4096)
  fi
  case $tg__s in
    *[\\\"$TG__CTL$TG__HI]*) tg__escape "$tg__s" ;;
    *) tg__j=$tg__s ;;
  esac
  if [ -n "$tg__lcset" ]; then LC_ALL=$tg__lc; else unset LC_ALL; fi
}

tg__escape() {
  tg__j=
  tg__r=$1
  while :; do
    tg__p=${tg__r%%[\\\"$TG__CTL$TG__HI]*}
    tg__j=$tg__j$tg__p
    tg__r=${tg__r#"$tg__p"}
    case $tg__r in
      '') return 0 ;;
      \\*) tg__j=$tg__j'\\'; tg__r=${tg__r#?} ;;
      \"*) tg__j=$tg__j'\"'; tg__r=${tg__r#?} ;;
      [$TG__WS]*) tg__j="$tg__j "; tg__r=${tg__r#?} ;;
      [$TG__CTL]*) tg__r=${tg__r#?} ;;
      *)  # a run of bytes >= 0x80: kept whole when it is valid UTF-8, else sequence by sequence
        tg__h=${tg__r%%[!$TG__HI]*}
        tg__r=${tg__r#"$tg__h"}
        tg__utf8 "$tg__h" || tg__utf8 "$tg__h" keep
        ;;
    esac
  done
}

tg__utf8() {  # RUN [keep]: without keep, appends RUN to tg__j if it is all valid UTF-8, else fails;
  # with keep, appends its valid sequences and drops the other bytes.
  tg__v=$1
  while [ -n "$tg__v" ]; do
    case $tg__v in
      [$TG__U2][$TG__CB]*) tg__x=${tg__v#??} ;;
      [$TG__E0][$TG__A0][$TG__CB]* | [$TG__U3][$TG__CB][$TG__CB]* | [$TG__ED][$TG__X9F][$TG__CB]*) tg__x=${tg__v#???} ;;
      [$TG__F0][$TG__X90][$TG__CB][$TG__CB]* | [$TG__U4][$TG__CB][$TG__CB][$TG__CB]* | \
        [$TG__F4][$TG__X8F][$TG__CB][$TG__CB]*) tg__x=${tg__v#????} ;;
      *) [ -n "${2-}" ] || return 1; tg__v=${tg__v#?}; continue ;;  # not the start of a valid sequence
    esac
    [ -z "${2-}" ] || tg__j=$tg__j${tg__v%"$tg__x"}
    tg__v=$tg__x
  done
  [ -n "${2-}" ] || tg__j=$tg__j$1
}

tg__write() {
  # The whole report in place by one printf builtin (the header says why that is safe).
  case $TG_REPORT in
    */*) tg__d=${TG_REPORT%/*}; tg__d=${tg__d:-/} ;;
    *) tg__d=. ;;
  esac
  [ -d "$tg__d" ] || mkdir -p "$tg__d"
  printf '{"results":{"tool":{"name":"termgym-assert"},"summary":{"tests":%d,"passed":%d,"failed":%d,"skipped":%d,"pending":0,"other":0,"start":%s,"stop":%s},"tests":[%s%s]}}\n' \
    "$((TG__PASSED + TG__FAILED + TG__SKIPPED))" "$TG__PASSED" "$TG__FAILED" "$TG__SKIPPED" \
    "$TG__START" "$TG__STOP" "$TG__ROWS" "${TG__ROWS:+$TG__NL}" > "$TG_REPORT"
}

tg__record() {  # name status message
  tg__json "$1"
  tg__row="{\"name\":\"$tg__j\",\"status\":\"$2\",\"duration\":0,\"message\":\""
  tg__json "$3"
  tg__row="$tg__row$tg__j\"}"
  TG__ROWS=${TG__ROWS:+$TG__ROWS,$TG__NL}$tg__row
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
    tg__m="exit $?: "
    if [ -s "$TG__OUT" ]; then  # its last 5 lines, each cut at 300 bytes; trailing newlines dropped
      tail -n 5 "$TG__OUT" | cut -c1-300 > "$TG__TMP/tail"
      tg__t=
      while IFS= read -r tg__l || [ -n "$tg__l" ]; do
        tg__t=$tg__t$tg__l$TG__NL
      done < "$TG__TMP/tail"
      while :; do
        case $tg__t in
          *"$TG__NL") tg__t=${tg__t%"$TG__NL"} ;;
          *) break ;;
        esac
      done
      tg__m=$tg__m$tg__t
    fi
    tg__record "$tg__name" failed "$tg__m"
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
  tg__ms
  TG__STOP=$tg__t
  tg__write
  [ -z "$TG__OWN_TMP" ] || rm -rf "$TG__TMP"
  printf '%d passed, %d failed, %d skipped\n' "$TG__PASSED" "$TG__FAILED" "$TG__SKIPPED"
  [ "$TG__FAILED" -eq 0 ] && exit 0
  exit 1
}

tg__write
