#!/bin/sh
# Acceptance checks of metnos-agent's sandbox and of its service (the
# LaunchAgent "metnos-agent install" loads) on macOS. Prints one line per
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
# The service cases (see service_gate).
label=org.metnos.agent
plist="$HOME/Library/LaunchAgents/$label.plist"
# The plist keeps the agent alive, and launchd starts it again at most
# ThrottleInterval (render.go's restartSec) after its last start; the
# restart case allows 5 s more.
restart_sec=5
restart_slack=5
svc_skip=      # why the service cases are skipped
svc_installed= # this run installed the service: uninstall it at the end
svc_exe=       # what the LaunchAgent runs
standin=       # this run made a stand-in pairing in $data_dir: remove the folder at the end
bg_pids=       # agents this run started by hand: killed at the end
data_dir=$("$AGENT" whoami 2>/dev/null | sed -n 's/^data dir:[[:space:]]*//p' | head -n 1) || data_dir=
data_existed=yes
if [ -n "$data_dir" ] && [ ! -e "$data_dir" ]; then data_existed=no; fi

# marked [PID [TEXT]]: the pids of the processes whose command line holds
# TEXT (the marker), but PID. TEXT goes through the environment, so that
# the filter's own command line does not hold it.
marked() {
	ps -axo pid=,command= | M=${2:-$marker} X=${1:-0} awk 'index($0, ENVIRON["M"]) && $1 != ENVIRON["X"] { print $1 }'
}

cleanup() {
	for p in $(marked) $bg_pids; do kill -9 "$p" 2>/dev/null || true; done
	if [ -n "$svc_installed" ]; then "$AGENT" uninstall >/dev/null 2>&1 </dev/null || echo "accept.sh: removing the service this run installed failed: run $AGENT uninstall" >&2; fi
	if [ -n "$standin" ] && [ -n "$data_dir" ]; then rm -rf "$data_dir"; fi
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

# agent_status [NAME=VALUE...]: runs "metnos-agent status" (with those
# environment variables) into $W/status; st NAME: the value of its line
# "NAME: value".
agent_status() { env "$@" "$AGENT" status >"$W/status" 2>&1 </dev/null || true; }
st() { sed -n "s/^$1:[[:space:]]*//p" "$W/status" | head -n 1; }
status_line() {
	if [ -z "$(st installed)" ]; then
		printf 'status said: %s' "$(tr '\n' ' ' <"$W/status")"
	else
		printf 'installed %s, enabled %s, running %s, supervisor says %s' "$(st installed)" "$(st enabled)" "$(st running)" "$(st 'supervisor says')"
	fi
}
running_pid() { st running | sed -n 's/^yes (process \([0-9]*\)).*/\1/p'; }
# wait_running SECS [NAME=VALUE...]: polls status until it says running.
wait_running() {
	n=$(($1 * 2))
	shift
	while [ "$n" -gt 0 ]; do
		agent_status "$@"
		case $(st running) in yes*) return 0 ;; esac
		sleep 0.5
		n=$((n - 1))
	done
	return 1
}
# agent_procs: the pids of the processes running "$svc_exe run".
agent_procs() { marked 0 "${svc_exe:-$AGENT} run"; }
said() { cat "$W/out" "$W/err" | tr '\n' ' '; }
# standin_pairing DIR makes DIR a paired device's data folder: a new device
# key, and a pairing with a server at 127.0.0.1:9, where nothing answers
# (the agent runs, and polls it again and again).
standin_pairing() {
	(umask 077 && mkdir -p "$1" && head -c 32 /dev/urandom >"$1/key")
	printf '{"device_id":"accept-standin-%s","device_name":"accept.sh stand-in","server_url":"http://127.0.0.1:9","server_public_key":"%s"}\n' \
		"$run" AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA >"$1/state.json"
}

# service_gate sets svc_skip to why the service cases cannot run here. They
# load, kill and remove the agent's LaunchAgent, so they run only where it
# is not installed and no agent runs. On a device not paired, the agent
# gets a stand-in pairing, in a data folder the script removes at the end:
# only where that folder did not exist before the script ran.
service_gate() {
	if [ -n "${METNOS_DATA_DIR:-}${METNOS_CACHE_DIR:-}" ]; then
		svc_skip="METNOS_DATA_DIR or METNOS_CACHE_DIR is set: run the script without them, so that the service uses this user's own data folder"
		return
	fi
	agent_status
	if [ "$(st installed)" != no ]; then
		svc_skip="the agent's service is installed here already ($(status_line)): these cases would replace and remove it; run them where it is not installed"
		return
	fi
	if [ "$(st running)" != no ]; then
		svc_skip="an agent runs here already (running: $(st running)): stop it first"
		return
	fi
	if "$AGENT" whoami 2>/dev/null | grep -q '^paired:[[:space:]]*no'; then
		if [ "$data_existed" != no ]; then
			svc_skip="this device is not paired and its data folder ${data_dir:-(unknown)} exists: a stand-in pairing is only made in a data folder the script can remove afterwards; pair the device, or move the folder away"
			return
		fi
		standin_pairing "$data_dir"
		standin=yes
	fi
}

c_svc_install() {
	service_gate
	if [ -n "$svc_skip" ]; then say SKIP service-install "$svc_skip"; return; fi
	rc=0
	"$AGENT" install >"$W/out" 2>"$W/err" </dev/null || rc=$?
	svc_installed=yes
	# The agent the plist runs (install resolved the path), XML unescaped.
	svc_exe=$(awk '/<key>ProgramArguments<\/key>/ { f = 1; next } f && /<string>/ { sub(/.*<string>/, ""); sub(/<\/string>.*/, ""); print; exit }' "$plist" 2>/dev/null |
		sed -e 's/&lt;/</g' -e 's/&gt;/>/g' -e 's/&#34;/"/g' -e "s/&#39;/'/g" -e 's/&amp;/\&/g')
	start=$(date +%s)
	wait_running 30 || true
	secs=$(($(date +%s) - start))
	procs=$(agent_procs | tr '\n' ' ')
	seen="install exit $rc; ${secs} s later status: $(status_line); $plist: $(if [ -e "$plist" ]; then echo present; else echo missing; fi); agent processes of ${svc_exe:-?}: ${procs:-none}; install said: $(said)"
	if [ "$rc" -eq 0 ] && [ "$(st installed)" = yes ] && [ "$(st enabled)" = yes ] && [ -n "$(running_pid)" ] &&
		[ "$(st 'supervisor says')" = running ] && [ "$(printf '%s' "$procs" | wc -w | tr -d ' ')" = 1 ]; then
		say PASS service-install "$seen"
	else say FAIL service-install "$seen"; fi
}

c_svc_restart() {
	if [ -n "$svc_skip" ]; then say SKIP service-restart "$svc_skip"; return; fi
	agent_status
	old=$(running_pid)
	cmd=$(ps -o command= -p "${old:-0}" 2>/dev/null || true)
	case $cmd in
	"$svc_exe run"*) ;;
	*)
		say FAIL service-restart "want the agent's process to kill: status: $(status_line); its command: '${cmd:-none}', want '$svc_exe run'"
		return
		;;
	esac
	kill -9 "$old"
	start=$(date +%s) new='' n=0
	limit=$((restart_sec + restart_slack))
	# Watched a while past the limit, to say how late a late start is.
	while [ "$n" -lt $(((limit + 20) * 2)) ]; do
		sleep 0.5
		n=$((n + 1))
		agent_status
		p=$(running_pid)
		if [ -n "$p" ] && [ "$p" != "$old" ]; then new=$p; break; fi
	done
	secs=$(($(date +%s) - start))
	if [ -n "$new" ]; then
		seen="killed agent process $old with kill -9; launchd started process $new ${secs} s later (the plist promises KeepAlive, ThrottleInterval $restart_sec s; allowed $limit s); status: $(status_line)"
	else
		seen="killed agent process $old with kill -9; no agent ${secs} s later; status: $(status_line); launchctl: $(launchctl print "gui/$(id -u)/$label" 2>&1 | grep -E 'state =|last exit|runs =' | tr '\n\t' '  ')"
	fi
	if [ -n "$new" ] && [ "$secs" -le "$limit" ]; then say PASS service-restart "$seen"
	else say FAIL service-restart "$seen"; fi
}

c_svc_logon() {
	say SKIP service-logon "logging out and in cannot be scripted from inside the session; to check it by hand: metnos-agent install, log out, log in, metnos-agent status (want running: yes), then metnos-agent uninstall"
}

c_svc_uninstall() {
	if [ -n "$svc_skip" ]; then say SKIP service-uninstall "$svc_skip"; return; fi
	rc=0
	"$AGENT" uninstall >"$W/out" 2>"$W/err" </dev/null || rc=$?
	if [ "$rc" -eq 0 ]; then svc_installed=; fi
	n=0
	while [ "$n" -lt 30 ] && [ -n "$(agent_procs)" ]; do
		sleep 0.5
		n=$((n + 1))
	done
	left=$(agent_procs | tr '\n' ' ')
	if launchctl print "gui/$(id -u)/$label" >/dev/null 2>&1; then loaded=loaded; else loaded='not loaded'; fi
	if [ -e "$plist" ]; then pl=left; else pl=gone; fi
	agent_status
	seen="uninstall exit $rc; $plist: $pl; launchd: $label $loaded; agent processes: ${left:-none}; status: $(status_line); uninstall said: $(said)"
	if [ "$rc" -eq 0 ] && [ "$pl" = gone ] && [ "$loaded" = 'not loaded' ] && [ -z "$left" ] &&
		[ "$(st installed)" = no ] && [ "$(st running)" = no ]; then
		say PASS service-uninstall "$seen"
	else say FAIL service-uninstall "$seen"; fi
}

# c_purge: with an agent running (started by hand, on a data folder of
# this run's with a stand-in pairing), uninstall --purge refuses and keeps
# the key; once it is stopped, it removes the folder.
c_purge() {
	agent_status
	if [ "$(st installed)" != no ]; then
		say SKIP uninstall-purge-refused "the agent's service is installed here ($(status_line)): uninstall --purge would remove it"
		return
	fi
	pd="$W/purge/metnos"
	standin_pairing "$pd"
	set -- METNOS_DATA_DIR="$pd" METNOS_CACHE_DIR="$W/purge/cache/metnos"
	env "$@" "$AGENT" run >"$W/run.out" 2>&1 </dev/null &
	rpid=$!
	bg_pids="$bg_pids $rpid"
	wait_running 30 "$@" || true
	r1=$(st running)
	rc=0
	env "$@" "$AGENT" uninstall --purge >"$W/out" 2>"$W/err" </dev/null || rc=$?
	s1=$(said)
	if [ -f "$pd/key" ]; then kept=kept; else kept=removed; fi
	kill -9 "$rpid" 2>/dev/null || true
	wait "$rpid" 2>/dev/null || true
	rc2=0
	env "$@" "$AGENT" uninstall --purge >"$W/out" 2>"$W/err" </dev/null || rc2=$?
	if [ -e "$pd" ]; then gone=left; else gone=removed; fi
	seen="an agent on $pd, running: ${r1:-?}; uninstall --purge: exit $rc, the key $kept; once the agent was stopped, uninstall --purge: exit $rc2, the folder $gone; the first uninstall --purge said: $s1"
	case $r1 in yes*) ran=yes ;; *) ran='' seen="$seen; the agent said: $(tr '\n' ' ' <"$W/run.out")" ;; esac
	if [ -n "$ran" ] && [ "$rc" -ne 0 ] && printf '%s' "$s1" | grep -q 'still holds' && [ "$kept" = kept ] &&
		[ "$rc2" -eq 0 ] && [ "$gone" = removed ]; then
		say PASS uninstall-purge-refused "$seen"
	else say FAIL uninstall-purge-refused "$seen"; fi
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
c_svc_install
c_svc_restart
c_svc_logon
c_svc_uninstall
c_purge

if [ "$skip" -gt 0 ]; then
	echo "$pass passed, $fail failed, $skip skipped"
else
	echo "$pass passed, $fail failed"
fi
if [ "$fail" -gt 0 ]; then exit 1; fi
