# Sourced by scripts/sidebyside.sh and scripts/amside.sh, not run: the
# statistics of their tables, the progress line, and the results file
# they write beside their tables when TSV=FILE is set, the same numbers in
# a form internal/tools/benchchart draws (its doc has the format).

# median: the median of the numbers on stdin, one per line ("-" if none).
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# spread FORMAT: "min–max" of the numbers on stdin ("" for fewer than two).
spread() { sort -g | awk -v f="$1" 'NR == 1 { lo = $1 } { hi = $1 } END { if (NR > 1) printf "%" f "–%" f, lo, hi }'; }

# progress_init NAME TOTAL, then progress LABEL before each run: a line on
# stderr saying which run of how many this is ("sidebyside: run 7 of 120:
# LABEL"), so a long invocation shows where it is.
progress_init() { PROGRESS_NAME=$1 PROGRESS_TOTAL=$2 PROGRESS_I=0; }
progress() {
  PROGRESS_I=$((PROGRESS_I + 1))
  echo "${PROGRESS_NAME:-bench}: run $PROGRESS_I of ${PROGRESS_TOTAL:-?}: $*" >&2
}

# tsv_start BENCH COMMAND: the results file's head (what, when, on which
# commit, by which command) and its header line, if TSV is set.
tsv_start() {
  [ -n "${TSV:-}" ] || return 0
  local commit
  commit=$(git rev-parse --short HEAD 2>/dev/null) || commit=unknown
  if [ "$commit" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then
    commit+=" with uncommitted changes"
  fi
  {
    echo "# bench: $1"
    echo "# date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "# commit: $commit"
    echo "# command: $2"
    printf 'figure\tunit\tsize\tstack\tbatch\tmedian\tmin\tmax\truns\n'
  } > "$TSV"
}

# tsv_row FIGURE UNIT SIZE STACK BATCH VALUES: one row of the results file
# from a configuration's runs (VALUES, one a line): their median, min, max
# and count ("-" for min and max of a single run). Nothing if TSV is unset
# or there are no runs.
tsv_row() {
  [ -n "${TSV:-}" ] || return 0
  [ -n "$6" ] || return 0
  local m
  m=$(printf '%s' "$6" | median)
  printf '%s' "$6" | sort -g | awk -v fig="$1" -v unit="$2" -v size="$3" -v stack="$4" -v batch="$5" -v m="$m" '
    NR == 1 { lo = $1 } { hi = $1 }
    END { if (NR > 1) printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", fig, unit, size, stack, batch, m, lo, hi, NR
          else printf "%s\t%s\t%s\t%s\t%s\t%s\t-\t-\t%d\n", fig, unit, size, stack, batch, m, NR }' >> "$TSV"
}
