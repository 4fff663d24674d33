#!/bin/sh
# Acceptance checks of metnos-agent's sandbox (with its runs' priority, its
# refusal of dry runs, and the owner's limits file) and of its service (the
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
# The limits cases (see limits_gate). The owner's limits file is where
# "metnos-agent limits --json" says (~/Library/Application
# Support/metnos/limits.toml, in the data folder); the cases that write it
# back it up first and put it back as it was as soon as they are done
# (and at the end, whatever happened).
D="$W/dry" N="$W/never"
limits_checked= # limits_gate ran
limits_skip=    # why the cases that write the limits file are skipped
lf=             # the owner's limits file
lf_had=         # it was there before this run wrote it (its copy: $W/limits-before)
lf_written=     # this run wrote it: restore_limits puts it back
lf_made_dir=    # this run made its folder: removed when empty again

# marked [PID [TEXT]]: the pids of the processes whose command line holds
# TEXT (the marker), but PID. TEXT goes through the environment, so that
# the filter's own command line does not hold it.
marked() {
	ps -axo pid=,command= | M=${2:-$marker} X=${1:-0} awk 'index($0, ENVIRON["M"]) && $1 != ENVIRON["X"] { print $1 }'
}

cleanup() {
	for p in $(marked) $bg_pids; do kill -9 "$p" 2>/dev/null || true; done
	if [ -n "$lf_written" ]; then
		restore_limits 2>/dev/null || true
		if [ -n "$lf_written" ]; then
			if [ -n "$lf_had" ]; then
				kept="$TMP/metnos-limits-before-accept-$run.toml"
				cp -p "$W/limits-before" "$kept" 2>/dev/null || true
				echo "accept.sh: could not put back the limits file $lf: copy $kept over it" >&2
			else
				echo "accept.sh: could not put back the limits file $lf: remove it (there was none before the run)" >&2
			fi
		fi
	fi
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

# limits_json: what "metnos-agent limits --json" says, in $W/limits;
# limit KEY: the value in force of one of its settings, as TOML writes it
# ("low", with its quotes).
limits_json() { "$AGENT" limits --json >"$W/limits" 2>&1 </dev/null || true; }
limit() {
	awk -v k="\"key\": \"$1\"," 'index($0, k) { f = 1; next } f && /"value":/ { sub(/^[[:space:]]*"value": "/, ""); sub(/",?[[:space:]]*$/, ""); gsub(/\\"/, "\""); print; exit }' "$W/limits"
}
in_force() { grep -q '"in_force": true' "$W/limits"; }
limits_error() { sed -n 's/^[[:space:]]*"error": "\(.*\)",*$/\1/p' "$W/limits" | head -n 1; }

# limits_gate sets lf to the owner's limits file, and limits_skip to why
# the cases that write it cannot run here. An agent that runs would put
# the file this run writes in force for its own invocations (it looks at
# the file after every poll) and record the change, and then its putting
# back, in its audit log: they run only where none runs. The agent
# refuses a file (or folder) that is not this user's or that the group or
# others may write (docs/limits.md, "Who can write it"): the file is
# written 0600, its folder made 0700 when there is none.
limits_gate() {
	limits_json
	lf=$(sed -n 's/^[[:space:]]*"file": "\(.*\)",$/\1/p' "$W/limits" | sed -e 's/\\"/"/g' -e 's/\\\\/\\/g' | head -n 1)
	if [ -z "$lf" ]; then
		limits_skip="metnos-agent limits --json named no limits file: $(tr '\n' ' ' <"$W/limits")"
		return
	fi
	agent_status
	case $(st running) in
	yes*) limits_skip="an agent runs here (running: $(st running)): it would put the limits this case writes in $lf in force for its own invocations and record the change in its audit log; stop it first" ;;
	esac
}
# limits_ok CASE: runs limits_gate once; says SKIP for CASE and fails when
# the limits file cannot be written.
limits_ok() {
	if [ -z "$limits_checked" ]; then
		limits_gate
		limits_checked=yes
	fi
	if [ -n "$limits_skip" ]; then
		say SKIP "$1" "$limits_skip"
		return 1
	fi
}
# set_limits CASE TEXT writes TEXT as the owner's limits file, having kept
# what was there (and made its folder when there was none); says FAIL for
# CASE and fails when it cannot.
set_limits() {
	if [ -z "$lf_written" ]; then
		lf_had=
		if [ -e "$lf" ]; then
			cp -p "$lf" "$W/limits-before" || { say FAIL "$1" "could not keep a copy of $lf"; return 1; }
			lf_had=yes
		fi
		if [ ! -d "$(dirname "$lf")" ]; then
			mkdir -m 700 "$(dirname "$lf")" || { say FAIL "$1" "could not make the folder of $lf"; return 1; }
			lf_made_dir=yes
		fi
		lf_written=yes
	fi
	if ! (umask 077 && printf '%s\n' "$2" >"$lf" && chmod 600 "$lf"); then
		say FAIL "$1" "could not write $lf"
		return 1
	fi
}
# restore_limits puts back what was there, and sets back to how that went.
restore_limits() {
	back=untouched
	if [ -z "$lf_written" ]; then return; fi
	if [ -n "$lf_had" ]; then cp -p "$W/limits-before" "$lf" || return 1; else rm -f "$lf" || return 1; fi
	if [ -n "$lf_made_dir" ] && rmdir "$(dirname "$lf")" 2>/dev/null; then lf_made_dir=; fi
	lf_written=
	if [ -z "$lf_had" ]; then
		if [ -e "$lf" ]; then back='still there, though there was none before'; else back='removed (there was none before)'; fi
	elif cmp -s "$W/limits-before" "$lf"; then back='put back as it was'
	else back='NOT as it was before'; fi
}
# toml_string S: S as a TOML basic string.
toml_string() { printf '"%s"' "$(printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g')"; }
# applied, missing: the priority report's lists in the JSON result.
applied() { sed -nE 's/.*"priority":\{[^}]*"applied":\[([^]]*)\].*/\1/p' "$W/out" | head -n 1; }
missing() { sed -nE 's/.*"priority":\{[^}]*"missing":\[([^]]*)\].*/\1/p' "$W/out" | head -n 1; }

# prio_watch TAG: while process $apid runs, the nice and scheduling
# priority of the /bin/sh whose command line holds TAG, read from outside
# with ps (a sandboxed command may not read its own: the profile allows
# no kern.proc sysctl): sets nice and pri (empty when it was not seen).
prio_watch() {
	nice='' pri='' i=0
	while [ "$i" -lt 50 ]; do
		case $(ps -o stat= -p "$apid" 2>/dev/null || echo Z) in Z*) break ;; esac
		line=$(ps -axo nice=,pri=,command= | M="exit 0 $1" awk '$3 ~ /sh$/ && index($0, ENVIRON["M"]) { print $1, $2; exit }')
		if [ -n "$line" ]; then
			nice=${line% *} pri=${line#* }
			return
		fi
		sleep 0.2
		i=$((i + 1))
	done
}
# prio_probe TAG [ARGS]: the same shell (sleep 2) run by exec --json ARGS,
# its nice and pri read by prio_watch; sets rc, leaves the result in
# $W/out. prio_control TAG: the same outside the sandbox.
prio_probe() {
	tag="$marker-$1"
	shift
	"$AGENT" exec --json "$@" -- /bin/sh -c 'sleep 2; exit 0' "$tag" >"$W/out" 2>"$W/err" </dev/null &
	apid=$!
	prio_watch "$tag"
	rc=0
	wait "$apid" || rc=$?
}
prio_control() {
	tag="$marker-$1"
	/bin/sh -c 'sleep 2; exit 0' "$tag" &
	apid=$!
	prio_watch "$tag"
	wait "$apid" || true
	ctl_nice=$nice ctl_pri=$pri
}

# c_prio_default: a command in the sandbox runs at nice 10 (nice -n 10,
# and taskpolicy's disk I/O policy utility), where the same command
# outside it runs at this script's nice: the change is the agent's.
c_prio_default() {
	limits_json
	cpu=$(limit priority.cpu)
	if [ -n "$cpu" ] && [ "$cpu" != '"low"' ]; then
		say SKIP priority-default "the limits in force say priority.cpu = $cpu (metnos-agent limits): this case checks the default, low"
		return
	fi
	prio_control ctl1
	if [ -z "$ctl_nice" ]; then say FAIL priority-default "control: ps did not see the shell run outside the sandbox"; return; fi
	want=$((ctl_nice + 10))
	if [ "$want" -gt 20 ]; then want=20; fi
	prio_probe low
	ap=$(applied)
	seen="nice inside the sandbox ${nice:-not seen} (pri ${pri:-?}), outside $ctl_nice (pri ${ctl_pri:-?}); priority applied: ${ap:-none}; $(describe); not applied: $(missing)"
	if ran && [ "$rc" -eq 0 ] && [ "$nice" = "$want" ] && printf '%s' "$ap" | grep -q '"nice 10"' &&
		printf '%s' "$ap" | grep -q '"disk I/O policy '; then
		say PASS priority-default "$seen"
	else say FAIL priority-default "$seen (want nice $want, and the report naming nice 10 and taskpolicy's disk I/O policy)"; fi
}

# c_prio_limits: with the owner's limits file saying [priority] cpu =
# "background", the command runs in darwin background (taskpolicy -b),
# with no nice of its own (the agent sets none for background on macOS:
# docs/sandbox.md's table), so at the nice outside. Darwin background is
# read, where perl is, by getpriority(PRIO_DARWIN_PROCESS (4), 0) in the
# sandbox: 1 in it (0 outside). The file is put back as it was at once.
c_prio_limits() {
	if ! limits_ok priority-from-limits; then return; fi
	prio_control ctl2
	bg_ctl='' bg_in=''
	if [ -x /usr/bin/perl ]; then bg_ctl=$(/usr/bin/perl -e 'print getpriority(4, 0)' 2>/dev/null || true); fi
	if ! set_limits priority-from-limits "$(printf '[priority]\ncpu = "background"')"; then restore_limits; return; fi
	limits_json
	lim_cpu=$(limit priority.cpu)
	if in_force; then lim_ok=yes; else lim_ok=; fi
	if [ -n "$bg_ctl" ]; then
		ex -- /usr/bin/perl -e 'print getpriority(4, 0)'
		if ran && [ "$rc" -eq 0 ]; then bg_in=$(field stdout); else bg_in="unread ($(describe))"; fi
	fi
	prio_probe bg
	restore_limits
	ap=$(applied)
	seen="darwin background (perl getpriority(4, 0)): inside the sandbox ${bg_in:-not read}, outside ${bg_ctl:-no perl}; nice inside ${nice:-not seen} (pri ${pri:-?}), outside ${ctl_nice:-?} (pri ${ctl_pri:-?}); priority applied: ${ap:-none}; $lf: cpu = \"background\" in force ${lim_ok:-no} (priority.cpu $lim_cpu), then $back; $(describe); not applied: $(missing); $(limits_error)"
	case $back in "NOT"* | still*) ok_back= ;; *) ok_back=yes ;; esac
	case $bg_in in 0) ok_bg= ;; *) ok_bg=yes ;; esac
	if [ -n "$lim_ok" ] && ran && [ "$rc" -eq 0 ] && [ -n "$nice" ] && [ "$nice" = "$ctl_nice" ] &&
		printf '%s' "$ap" | grep -q '"darwin background' && [ -n "$ok_bg" ] && [ -n "$ok_back" ]; then
		say PASS priority-from-limits "$seen"
	else say FAIL priority-from-limits "$seen (want darwin background in the report and, where perl reads it, in force; the nice unchanged)"; fi
}

# c_dry_run: a dry run needs a copy-on-write layer, which only Linux
# gives: exec --dry-run refuses (125, saying why) and runs nothing, where
# the same command without --dry-run writes its file.
c_dry_run() {
	t=$(rnd 16)
	# shellcheck disable=SC2016 # $1 and $2 are the inner shell's
	ex --dry-run --write "$D" -- /bin/sh -c 'echo "$1" >"$2"' sh "$t" "$D/dry.txt"
	rc1=$rc why=$(field error)
	if grep -q '"refused"[[:space:]]*:[[:space:]]*true' "$W/out"; then refused=true; else refused=false; fi
	if [ -z "$why" ]; then why=$(tr '\n' ' ' <"$W/err"); fi
	if [ -e "$D/dry.txt" ]; then made=CREATED; else made=absent; fi
	# shellcheck disable=SC2016
	ex --write "$D" -- /bin/sh -c 'echo "$1" >"$2"' sh "$t" "$D/real.txt"
	if grep -qF "$t" "$D/real.txt" 2>/dev/null; then wrote=written; else wrote="missing ($(describe))"; fi
	seen="--dry-run: exit $rc1, refused $refused, said: $why; dry/dry.txt $made; without --dry-run: dry/real.txt $wrote"
	case $why in *copy-on-write*) ok_why=yes ;; *) ok_why= ;; esac
	if [ "$rc1" -eq 125 ] && [ "$refused" = true ] && [ -n "$ok_why" ] && [ "$made" = absent ] && [ "$wrote" = written ]; then
		say PASS dry-run-refused "$seen"
	else say FAIL dry-run-refused "$seen (want exit 125 saying why, no file, and the control's file written)"; fi
}

# c_never: a folder the owner's limits file lists in never joins the
# nucleus: exec --read of the folder above it cannot read a file in it,
# where it could before the file said so. Only never (and [network] and
# [priority]) of the file apply to exec: mode (readonly, preview) and
# [executors] are about executors, which exec does not run (docs/limits.md,
# "What it does not do"; cli/exec.go takes no mode), so no case here
# writes a mode: run applies it, to a server's invocations.
c_never() {
	if ! limits_ok never-from-limits; then return; fi
	t=$(rnd 16)
	printf '%s\n' "$t" >"$N/secret.txt"
	ex --read "$W" -- /bin/cat "$N/secret.txt"
	if ! { ran && [ "$rc" -eq 0 ] && printed "$t"; }; then
		say FAIL never-from-limits "control: before the limits file listed it, --read $W could not read never/secret.txt: $(describe)"
		return
	fi
	if ! set_limits never-from-limits "never = [$(toml_string "$N")]"; then restore_limits; return; fi
	limits_json
	if in_force; then lim_ok=yes; else lim_ok=; fi
	ex --read "$W" -- /bin/cat "$N/secret.txt"
	restore_limits
	if ran && [ "$rc" -ne 0 ] && ! printed "$t"; then hidden=yes
	elif ! ran && [ "$rc" -eq 125 ] && ! printed "$t"; then hidden=yes
	else hidden=; fi
	seen="--read $W, cat never/secret.txt: $(describe); before the limits file listed never/, it printed the token; $lf: never = [$N] in force ${lim_ok:-no}, then $back $(limits_error)"
	case $back in "NOT"* | still*) ok_back= ;; *) ok_back=yes ;; esac
	if [ -n "$lim_ok" ] && [ -n "$hidden" ] && [ -n "$ok_back" ]; then say PASS never-from-limits "$seen"
	else say FAIL never-from-limits "$seen"; fi
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

mkdir "$G" "$O" "$D" "$N"
tmp_entries >"$W/tmp-before"
c_word
c_nucleus
c_read
c_write
c_net
c_deadline
c_prio_default
c_prio_limits
c_dry_run
c_never
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
