# Counting and reporting for the check scripts (check-deploy.sh,
# check-image.sh); sourced, not run:
#
#   . "$(dirname "$0")/lib/checks.sh"
#   ok "what held"; fail "what did not"
#   helper >"$out" || true; report_lines "$out" "what the helper checks"
#   checks_summary "deploy check"    # prints the tally; fails if any failed
#
# Every check runs and all failures are reported at the end.

passed=0
failed=0
ok() {
  echo "ok: $*"
  passed=$((passed + 1))
}
fail() {
  echo "FAILED: $*"
  failed=$((failed + 1))
}

# report_lines FILE WHAT: the "OK ..." and "FAIL ..." lines a helper
# program wrote to FILE, counted as passes and failures. Any other line,
# or no line at all, is a failure of WHAT.
report_lines() {
  local file=$1 what=$2 line
  [ -s "$file" ] || fail "$what produced no output"
  while IFS= read -r line; do
    case "$line" in
      OK\ *) ok "${line#OK }" ;;
      FAIL\ *) fail "${line#FAIL }" ;;
      *) fail "$what: $line" ;;
    esac
  done <"$file"
}

# checks_summary NAME: "NAME: P passed, F failed"; returns 1 if any failed.
checks_summary() {
  echo
  echo "$1: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}
