# Sourced by setup.sh (and by scripts/gocheck_test.go): the Go check.

# check_go TOP: the go on PATH is at least the version TOP/go.mod names (its
# "go" line), as go runs in TOP: Go 1.21 and newer switch to the toolchain
# go.mod names by themselves (GOTOOLCHAIN=auto, downloading it once), so
# only an older go, or one that cannot download, fails. On failure it says
# which go it found and exactly how to install a new enough one, on stderr,
# and returns 1.
check_go() {
  local top=$1 need have v
  need=$(awk '$1 == "go" { print $2; exit }' "$top/go.mod")
  if [ -z "$need" ]; then
    echo "setup: $top/go.mod has no go line" >&2
    return 1
  fi
  local hint="Install Go $need or newer from go.dev (Debian 12's golang-go is 1.19, too old), as root:
    curl -fsSL -o /tmp/go.tar.gz https://go.dev/dl/go$need.linux-amd64.tar.gz
    rm -rf /usr/local/go && tar -C /usr/local -xzf /tmp/go.tar.gz
    export PATH=/usr/local/go/bin:\$PATH    # this shell; add the line to ~/.profile for the next
then run make again."
  if [ -n "${SUDO_USER:-}" ]; then
    hint+="
(sudo resets PATH to its secure_path, which lacks /usr/local/go/bin: run make in a root shell, sudo -i.)"
  fi
  if ! command -v go >/dev/null; then
    echo "setup: go is not on PATH. $hint" >&2
    return 1
  fi
  # The version of the go that make will run, toolchain switch included;
  # if the switch fails (no network), the local go's own.
  if ! have=$(cd "$top" && go env GOVERSION 2>/dev/null) || [ -z "$have" ]; then
    have=$(cd / && go version 2>/dev/null)
  fi
  if ! [[ $have =~ go([0-9]+(\.[0-9]+)*) ]]; then
    echo "setup: cannot read the version of $(command -v go) (it said \"$have\"). $hint" >&2
    return 1
  fi
  v=${BASH_REMATCH[1]}
  if ! version_at_least "$v" "$need"; then
    echo "setup: $(command -v go) is go$v; go.mod needs go $need or newer. $hint" >&2
    return 1
  fi
}

# version_at_least A B: A >= B, each dotted numbers (1.26, 1.26.0).
version_at_least() {
  local -a a b
  IFS=. read -r -a a <<<"$1"
  IFS=. read -r -a b <<<"$2"
  local i x y
  for i in 0 1 2 3; do
    x=${a[i]:-0} y=${b[i]:-0}
    ((10#$x > 10#$y)) && return 0
    ((10#$x < 10#$y)) && return 1
  done
  return 0
}
