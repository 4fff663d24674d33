#!/bin/sh
# Acceptance checks of metnos-agent's sandbox on macOS. Prints one line per
# case (PASS, FAIL or SKIP), then "N passed, N failed[, N skipped]"; exits 0
# only when nothing failed. See README.md beside it.
#
#   sh accept.sh [path/to/metnos-agent]
#
# POSIX sh (macOS's /bin/sh, bash 3.2), and only what macOS ships.
set -eu

AGENT=${1:-metnos-agent}
case $AGENT in
*/*) ;;
*) AGENT=$(command -v "$AGENT" 2>/dev/null) || AGENT= ;;
esac
if [ -z "$AGENT" ] || [ ! -x "$AGENT" ]; then
	echo "accept.sh: ${1:-metnos-agent} not found: give the path to metnos-agent as the first argument" >&2
	exit 2
fi

rnd() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }
run=$(rnd 6)
marker="metnosaccept$run"
TMP=${TMPDIR:-/tmp}
TMP=${TMP%/}
secret="$HOME/.ssh/metnos-accept-$run.txt"
made_ssh=0
word=
pass=0 fail=0 skip=0
W=$(mktemp -d "$TMP/accept-$run.XXXXXX")
W=$(cd "$W" && pwd -P) # Seatbelt sees /private/var/..., not /var/...
G="$W/granted" O="$W/other"

# marked [PID [TEXT]]: the pids of the processes whose command line holds
# TEXT (the marker), but PID. TEXT goes through the environment, so that
# the filter's own command line does not hold it.
marked() {
	ps -axo pid=,command= | M=${2:-$marker} X=${1:-0} awk 'index($0, ENVIRON["M"]) && $1 != ENVIRON["X"] { print $1 }'
}

cleanup() {
	for p in $(marked); do kill -9 "$p" 2>/dev/null || true; done
	rm -f "$secret"
	if [ "$made_ssh" = 1 ]; then rmdir "$HOME/.ssh" 2>/dev/null || true; fi
	rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 141' PIPE
trap 'exit 143' TERM

say() {
	case $1 in PASS) pass=$((pass + 1)) ;; FAIL) fail=$((fail + 1)) ;; SKIP) skip=$((skip + 1)) ;; esac
	printf '%s %s: %s\n' "$1" "$2" "$(printf '%s' "$3" | tr '\n\r\t' '   ' | cut -c1-500)"
}

# ex ARGS: runs "metnos-agent exec --json ARGS"; sets rc, leaves the output
# in $W/out and $W/err.
ex() {
	rc=0
	"$AGENT" exec --json "$@" >"$W/out" 2>"$W/err" </dev/null || rc=$?
}
# field NAME: the string field NAME of the JSON result, still escaped.
field() { sed -nE 's/.*"'"$1"'"[[:space:]]*:[[:space:]]*"(([^"\\]|\\.)*)".*/\1/p' "$W/out" | head -n 1; }
ran() { grep -q '"sandbox"[[:space:]]*:' "$W/out"; } # a result, not {"error": ...}
printed() { grep -qF -- "$1" "$W/out" "$W/err"; }
describe() {
	if ran; then
		printf '%s\n' "exit $rc in $(field sandbox), stdout '$(field stdout)', stderr '$(field stderr)'"
	else
		printf '%s\n' "exit $rc, not run: $(field error) $(cat "$W/err")"
	fi
}

c_word() {
	ex -- /usr/bin/true
	word=$(field sandbox)
	reason=$(field reason)
	seen="sandbox '$word'; reason: ${reason:-none}"
	if ! ran; then say FAIL word "$(describe)"
	elif [ "$word" = seatbelt ] && [ "$rc" -eq 0 ]; then say PASS word "$seen"
	else say FAIL word "$seen (want seatbelt)"; fi
}

c_nucleus() {
	t=$(rnd 16)
	if [ ! -d "$HOME/.ssh" ]; then
		mkdir -m 700 "$HOME/.ssh"
		made_ssh=1
	fi
	(umask 077 && printf 'secret %s\n' "$t" >"$secret")
	plain=$(/bin/cat "$secret" 2>&1 || true)
	case $plain in
	*"$t"*) ;;
	*)
		say FAIL nucleus-home-grant "control: cat outside the sandbox did not print the planted file: $plain"
		return
		;;
	esac
	ex --read "$HOME" -- /bin/cat "$secret"
	seen="--read $HOME, cat $secret: $(describe); outside the sandbox it printed the token"
	if ran && [ "$rc" -ne 0 ] && ! printed "$t"; then say PASS nucleus-home-grant "$seen"
	else say FAIL nucleus-home-grant "$seen"; fi
}

c_read() {
	g=$(rnd 16) o=$(rnd 16)
	printf '%s\n' "$g" >"$G/g.txt"
	printf '%s\n' "$o" >"$O/o.txt"
	ex --read "$G" -- /bin/cat "$G/g.txt"
	if ran && [ "$rc" -eq 0 ] && printed "$g"; then ok1='read'; else ok1=; fi
	d1=$(describe)
	ex --read "$G" -- /bin/cat "$O/o.txt"
	if ran && [ "$rc" -ne 0 ] && ! printed "$o"; then ok2='not readable'; else ok2=; fi
	seen="granted/g.txt: ${ok1:-$d1}; other/o.txt: ${ok2:-$(describe)}"
	if [ -n "$ok1" ] && [ -n "$ok2" ]; then say PASS grant-read "$seen"; else say FAIL grant-read "$seen"; fi
}

c_write() {
	w1=$(rnd 16) w2=$(rnd 16)
	# shellcheck disable=SC2016 # $1 and $2 are the inner shell's
	ex --write "$G" -- /bin/sh -c 'echo "$1" >"$2"' sh "$w1" "$G/new.txt"
	d1=$(describe)
	# shellcheck disable=SC2016
	ex --write "$G" -- /bin/sh -c 'echo "$1" >"$2"' sh "$w2" "$O/new.txt"
	if grep -qF "$w1" "$G/new.txt" 2>/dev/null; then ok1='written'; else ok1=; fi
	if [ -e "$O/new.txt" ]; then ok2='' d2="created ($(describe))"
	elif ran; then ok2='absent'
	else ok2='' d2="absent, but not run: $(describe)"; fi
	seen="on disk: granted/new.txt ${ok1:-missing ($d1)}; other/new.txt ${ok2:-$d2}"
	if [ -n "$ok1" ] && [ -n "$ok2" ]; then say PASS grant-write "$seen"; else say FAIL grant-write "$seen"; fi
}

c_net() {
	if ! /usr/bin/nc -z -w 3 1.1.1.1 443 >/dev/null 2>&1; then
		say SKIP no-network "no network on this machine: nc outside the sandbox could not reach 1.1.1.1:443"
		return
	fi
	ex -- /usr/bin/nc -z -w 3 1.1.1.1 443
	if ran && [ "$rc" -ne 0 ]; then cut='yes'; else cut=; fi
	d1=$(describe)
	ex --net -- /usr/bin/nc -z -w 3 1.1.1.1 443
	if ran && [ "$rc" -eq 0 ]; then open='connected'; else open=; fi
	seen="nc 1.1.1.1:443 without --net: $d1; with --net: ${open:-$(describe)}; outside: connected"
	if [ -n "$cut" ] && [ -n "$open" ]; then say PASS no-network "$seen"
	elif [ -n "$cut" ]; then say FAIL no-network "$seen (with --net it fails too: the cut is not shown to be the sandbox's)"
	else say FAIL no-network "$seen"; fi
}

c_deadline() {
	start=$(date +%s)
	"$AGENT" exec --json --timeout 3s -- /bin/sh -c "/bin/sh -c 'sleep 60; exit 0' $marker & wait" \
		>"$W/out" 2>"$W/err" </dev/null &
	apid=$!
	seen_child=no i=0
	# Until the agent ends (a zombie counts as ended), 30 s at most.
	while [ "$i" -lt 100 ]; do
		case $(ps -o stat= -p "$apid" 2>/dev/null || echo Z) in Z*) break ;; esac
		if [ -n "$(marked "$apid" "exit 0 $marker")" ]; then seen_child=yes; fi
		sleep 0.3
		i=$((i + 1))
	done
	rc=0
	wait "$apid" || rc=$?
	secs=$(($(date +%s) - start))
	sleep 2
	left=$(marked | tr '\n' ' ')
	seen="exit $rc after ${secs} s, grandchild seen running: $seen_child, alive 2 s later: ${left:-none}"
	if [ "$rc" -eq 124 ] && [ "$seen_child" = yes ] && [ -z "$left" ]; then say PASS deadline-kills-tree "$seen"
	else say FAIL deadline-kills-tree "$seen; stderr: $(cat "$W/err")"; fi
}

# tmp_entries: the metnos* entries of the temporary folder. The agent
# passes its Seatbelt profile inline (sandbox-exec -p) and makes one
# metnos-run-<pid>-* folder a run, which it removes afterwards.
tmp_entries() {
	for f in "$TMP"/metnos*; do
		if [ -e "$f" ]; then printf '%s\n' "$f"; fi
	done
}

c_leftovers() {
	bad=
	while IFS= read -r f; do
		if [ -n "$f" ] && ! grep -qxF -- "$f" "$W/tmp-before"; then bad="$bad new $f;"; fi
	done <<EOF
$(tmp_entries)
EOF
	for p in $(marked); do bad="$bad process $p;"; done
	if [ -z "$bad" ]; then say PASS no-leftovers "no new metnos* entry in $TMP; no marked process"
	else say FAIL no-leftovers "$bad"; fi
}

mkdir "$G" "$O"
tmp_entries >"$W/tmp-before"
c_word
c_nucleus
c_read
c_write
c_net
c_deadline
c_leftovers

if [ "$skip" -gt 0 ]; then
	echo "$pass passed, $fail failed, $skip skipped"
else
	echo "$pass passed, $fail failed"
fi
if [ "$fail" -gt 0 ]; then exit 1; fi
