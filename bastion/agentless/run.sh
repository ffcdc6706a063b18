#!/bin/sh
# postern-run: runs a command under a durable marker, at most once per execution id.
# Installed by `postern hosts enroll --marker-script` as ~/.postern/run. Do not edit it: the
# bastion checks its SHA-256 before every use and refuses a changed file (re-enroll instead).
#
# Usage:
#   run exec ID CWD TIMEOUT_S COMMAND   run COMMAND once under marker ID
#   run status ID                       print the marker of ID
#   run list                            print every marker
#
# Answers (protocol 1) are one line, "postern-run:1:" then a word and key=value fields:
# exec writes it to stderr before anything of the command, status and list to stdout.
#   started id=ID                                the marker is durable; the command starts now
#   duplicate id=ID state=…                      ID ran before (or runs): nothing was started
#   refused reason=…                             nothing was started; no marker was written
#                                                (marker_write: the id stays claimed)
#   status id=ID state=… retention_days=N
# States: absent; claimed old=0|1 (the id is taken, the start not yet recorded); running;
# interrupted (started, its process is gone without an exit record); exited exit=N.
#
# A marker is ~/.postern/markers/ID/: the directory is the claim (mkdir is atomic), then
# command and started ("PID STARTTIME BOOT_ID" of the wrapper; the file's mtime is the start
# time), synced together with both directories before the command starts; once it ended,
# exit ("STATUS"), synced with the marker directory. A partly written record (a crash, or a
# reader, in the middle of the write) reads as not there yet: a started record that does not
# parse is a claim, an exit record that does not parse no exit. Each step runs as few
# processes as it can: this is on every command's path.
set -u
# The wrapper's own files are private and its patterns byte-wise; the command gets the
# account's umask and locale back (run_command).
umask_of_account=$(umask)
lc_all_of_account=${LC_ALL-} lc_all_was_set=${LC_ALL+set}
umask 077
LC_ALL=C

P=postern-run:1:
base=$HOME/.postern
markers=$base/markers
# Finished markers are kept this long; the bastion re-sends an execution with no marker only
# while it is younger than this.
retention_days=30

answer() { printf '%s%s\n' "$P" "$*" >&2; }
refuse() { answer "refused reason=$1"; exit 255; }

# durable fsyncs the files and directories named (coreutils sync FILE, since 8.24); where
# that is unsupported it falls back to sync(2) of everything, which is as durable.
durable() { sync -- "$@" 2>/dev/null || sync; }

# valid_id: "ex_" and 26 upper-case Crockford base32 characters, nothing else.
valid_id() {
	case $1 in ex_??????????????????????????) ;; *) return 1 ;; esac
	case ${1#ex_} in *[!0123456789ABCDEFGHJKMNPQRSTVWXYZ]*) return 1 ;; esac
}

# boot_id sets $boot to this boot's id, or "none" without /proc.
boot_id() { boot=none; read -r boot 2>/dev/null </proc/sys/kernel/random/boot_id || boot=none; }

# proc_start sets $start to a process's start time in clock ticks since boot (field 22 of
# /proc/PID/stat, counted after the command name, which may hold spaces), or "none".
proc_start() {
	start=none
	read -r s 2>/dev/null <"/proc/$1/stat" || return 0
	s=${s##*") "}
	# shellcheck disable=SC2086 # split into fields on purpose
	set -- $s
	start=${20:-none}
}

# alive: the wrapper that started the marker (PID, STARTTIME, BOOT_ID) still runs.
alive() {
	boot_id
	[ "$3" = "$boot" ] || return 1
	kill -0 "$1" 2>/dev/null || return 1
	proc_start "$1"
	[ "$2" = "$start" ]
}

# exit_code sets $code from the marker's exit record; false when it has none (or a partly
# written one).
exit_code() {
	code=
	[ -f "$1/exit" ] && read -r code _ 2>/dev/null <"$1/exit"
	case $code in '' | *[!0-9]*) return 1 ;; esac
}

state_of() {
	d=$1
	if exit_code "$d"; then
		echo "state=exited exit=$code"
		return
	fi
	rpid='' rstart='' rboot=''
	[ -f "$d/started" ] && read -r rpid rstart rboot _ 2>/dev/null <"$d/started"
	case $rpid in '' | *[!0-9]*) rpid='' ;; esac
	if [ -z "$rpid" ] || [ -z "$rboot" ]; then
		# Claimed, start not recorded: the wrapper is between the two steps, or it died
		# there (then the command never started). Five minutes tell them apart in practice.
		if [ -n "$(find "$d" -prune -mmin +5 2>/dev/null)" ]; then
			echo "state=claimed old=1"
		else
			echo "state=claimed old=0"
		fi
		return
	fi
	if alive "$rpid" "$rstart" "$rboot"; then
		echo "state=running"
	elif exit_code "$d"; then
		echo "state=exited exit=$code"
	else
		echo "state=interrupted"
	fi
}

# prune removes finished markers older than the retention: on the first run, then on about
# one run in 64 (by pid: no process to decide it).
prune() {
	if [ ! -e "$base/pruned" ] || [ $(($$ % 64)) -eq 0 ]; then
		: >"$base/pruned"
		find "$markers" -mindepth 2 -maxdepth 2 -name exit -mtime +"$retention_days" 2>/dev/null |
			while IFS= read -r f; do rm -rf -- "${f%/exit}"; done
	fi
}

# run_command runs $command (with $timeout) as the account would: its umask and locale.
run_command() {
	umask "$umask_of_account"
	if [ -n "$lc_all_was_set" ]; then LC_ALL=$lc_all_of_account; else unset LC_ALL; fi
	if [ "$timeout" != 0 ]; then
		timeout -k 10 "$timeout" /bin/sh -c "$command" </dev/null
	else
		/bin/sh -c "$command" </dev/null
	fi
	rc=$?
	umask 077
	LC_ALL=C
	return "$rc"
}

cmd_exec() {
	[ $# -eq 4 ] || refuse usage
	id=$1 cwd=$2 timeout=$3 command=$4
	valid_id "$id" || refuse bad_id
	case $timeout in '' | *[!0-9]*) refuse bad_timeout ;; esac
	# Everything that can refuse does so before the claim: a refusal leaves no marker.
	if [ -n "$cwd" ]; then cd -- "$cwd" 2>/dev/null || refuse cwd; fi
	if [ "$timeout" != 0 ] && ! command -v timeout >/dev/null 2>&1; then refuse timeout_unsupported; fi
	if [ ! -d "$markers" ] && ! { mkdir -p "$markers" 2>/dev/null && chmod 700 "$base" "$markers"; }; then
		refuse marker_dir
	fi
	prune
	d=$markers/$id
	if ! mkdir -m 700 "$d" 2>/dev/null; then
		[ -d "$d" ] || refuse marker_dir
		answer "duplicate id=$id $(state_of "$d")"
		exit 0
	fi
	# From here on the id is taken: a failure leaves a claimed marker, never a second run.
	proc_start $$
	boot_id
	{
		printf '%s' "$command" >"$d/command" &&
			printf '%s %s %s\n' "$$" "$start" "$boot" >"$d/started" &&
			durable "$d/command" "$d/started" "$d" "$markers"
	} || refuse marker_write
	# The channel may be gone already: the command runs regardless (its marker tells how it
	# ended), so a failed write of the answer must not kill the wrapper.
	trap '' PIPE
	answer "started id=$id"
	trap - PIPE
	run_command
	code=$?
	{ printf '%s\n' "$code" >"$d/exit" && durable "$d/exit" "$d"; } 2>/dev/null ||
		answer "warning id=$id reason=exit_not_recorded"
	exit "$code"
}

cmd_status() {
	if [ $# -ne 1 ] || ! valid_id "$1"; then
		printf '%srefused reason=bad_id\n' "$P"
		exit 255
	fi
	if [ -d "$markers/$1" ]; then
		printf '%sstatus id=%s %s retention_days=%s\n' "$P" "$1" "$(state_of "$markers/$1")" "$retention_days"
	else
		printf '%sstatus id=%s state=absent retention_days=%s\n' "$P" "$1" "$retention_days"
	fi
}

cmd_list() {
	for d in "$markers"/ex_*; do
		[ -d "$d" ] || continue
		printf '%sstatus id=%s %s retention_days=%s\n' "$P" "${d##*/}" "$(state_of "$d")" "$retention_days"
	done
}

[ $# -ge 1 ] || refuse usage
mode=$1
shift
case $mode in
exec) cmd_exec "$@" ;;
status) cmd_status "$@" ;;
list) cmd_list ;;
*) refuse usage ;;
esac
