// Package policy decides whether an actor may start an execution, under which action
// class, and whether a person must approve it first. It owns the configured actors, the
// rules, the parsing of shell commands and the decision ladder; it does no I/O. The
// bastion owns what needs state: the journal (journal unavailable → deny is checked
// before Decide), concurrency limits and daily quotas (Actor.MaxConcurrent/DailyQuota),
// and approvals themselves.
//
// # Actors
//
// Request.Actor is the configured actor's name: the bastion maps a bearer token to its
// actor (by TokenSHA256; the transport's "token:<name>" minus the prefix) and a local peer
// with LocalActor(uid, exe) — the first local actor in config order whose uid and exe
// (each only if set) match. A local caller no actor matches has Actor "" and is rejected.
// Actor.Default "deny" makes the actor's rules an allow-list (below).
//
// # The ladder
//
// Fixed order; the first step that decides ends it, and Decision.Steps records each step:
//
//  1. actor unknown → rejected (actor_unknown)
//  2. the actor may not use the tool (Actor.Tools), the request has no target (ssh_exec
//     without Host, http_request without Endpoint: target_unknown), or the actor may not
//     use the host (Actor.Hosts, globs over the name and "group:<glob>" over its groups)
//     or endpoint (Actor.Endpoints) → rejected (not_allowed); an ssh_exec to run as another
//     account than the host's enrolled one (Request.Account) that no account grant gives the
//     actor on the host → rejected (not_allowed)
//  3. the class is computed (below), so every outcome carries one
//  4. any applicable deny rule matches → rejected (denied; unparsable when a program of
//     the command is unknowable and the rule has command or writes patterns). Deny wins
//     over allow, approve and class rules whatever their order.
//  5. the actor's Default is "deny": every program of the command (ssh_exec) or the call
//     (http_request) must be named by an applicable allow rule → else rejected
//     (not_allowed; unparsable when a program is unknowable)
//  6. any applicable approve rule matches → awaiting_approval
//  7. authorized; Decision.Rule names the rule that set the class, or the default.
//
// Every outcome carries Decision.Reason (why, in plain words: the rule, the layer and the
// pattern that matched, or the word that made a program unknowable) and every refusal
// Decision.Repair (what the caller can do); Decision.Layer and Decision.Word point at what
// decided.
//
// An account grant is a rule with Accounts (decision "allow", actors and hosts only): its
// actors may run commands as those accounts on its hosts. It is no allow rule for programs
// and takes part in no other step; the host's hostagent still enforces its own
// allowed_accounts.
//
// A rule applies when its Actors list names the actor (or is empty), its Hosts match
// the host or one of its groups (or are empty; a rule with Hosts never applies to a
// request without a host), and its target kind fits the tool: a rule with Commands or
// Writes only applies to ssh_exec, a rule with Endpoints or Methods only to http_request
// (methods compare case-insensitively), a rule with none of them to every tool.
//
// # Commands: what is unknowable
//
// A command line is parsed as bash parses it (Parse) into layers: every simple command —
// in lists, pipes, loops, conditionals, function bodies (judged where they are defined; a
// call of a function is judged by its name, like any program), command and process
// substitutions, here-documents' expansions — and what each runs through the wrappers
// below. Patterns match the layers' words (MatchArgv), never the string.
//
// Words the shell expands in argument positions keep the program known: globs,
// variables, substitutions, tildes, braces, $'…'. Such a word is known only at run time
// (Layer.Unknown; Layer.Spread when it may become several words or none). For deny and
// approve rules it matches any pattern word it could fill (rm $F, rm *.log and
// rm "$(cat list)" meet "rm **"); for a looser class or an allow rule only '*' (one word)
// or a final "**" covering it. Rules naming other programs are not triggered by them.
//
// A program is unknowable (Script.Unknowable) where it cannot be known before the line
// runs: an expansion in the command position ($CMD, $(…), `…`, "$dir"/tool, a glob),
// eval, source, ., alias, unalias, enable, trap, fc, bind, compgen, hash -p, mapfile -C,
// set -k, zsh's emulate, sched and zmodload, a shell reading its input (… | sh,
// sh <<EOF, bash -s), a wrapper option or form the unwrapper does not know, setting or
// unsetting a variable that changes what runs (PATH, LD_*, BASH_ENV, ENV, PS4,
// SHELLOPTS, SHELL, BASH_ALIASES, BASH_CMDS, EDITOR, …; IFS is fine in a script), bash
// arithmetic over a variable ($((i+1)), ((…)), let, for ((…)), [[ $x -eq 1 ]], ${a[$i]},
// ${x:$n}, declare -i) or a name with a subscript (printf -v, read, unset, declare,
// [ -v ]) — bash evaluates a value such as a[$(cmd)] there and runs cmd —, ${!x},
// ${x@P}, extended globs (zsh runs code in glob qualifiers), a command name that is not
// printable ASCII (fullwidth or Cyrillic look-alikes), starts with '-' or is empty, a
// parse error, an empty line, more than MaxCommandBytes, 16 wrapper levels, 256 layers of
// one simple command or 4096 of the line. An unknowable program matches every command and
// writes pattern of deny and approve rules (code unparsable), is denied under default
// deny, and gets the strictest class any applicable rule gives, never looser than
// remote_command.
//
// Every deny and approve rule fires when ANY layer matches any of its patterns. A layer's
// class is the strictest class among the class rules that could match it, and the default
// (remote_command) unless one matches it whatever its run-time words; the command's class
// is the strictest of its layers'. So a class rule only gives a looser class than the
// default when it matches EVERY layer, a wrapper never loosens a class (sudo df keeps the
// default; sudo migrate is irreversible), and a script is never looser than any part.
// A command named by a path (/bin/rm, ./rm) is judged both as written and under its base
// name, and the stricter reading wins (an allow rule reads it only as written).
//
// # Writes
//
// The files the shell's redirections open are part of the parse (Script.Writes: > >> >|
// &> &>> <> and >&NAME; /dev/null and descriptor duplication excepted; Script.Reads: <
// <>), the redirections of sh -c strings included; opening /dev/tcp or /dev/udp is a
// write whatever the direction. A rule's Writes are globs over them
// ('*' crossing '/'): a path known only at run time matches every writes pattern, a
// relative path matches when some directory would make it match (the policy does not
// know the working directory), paths are cleaned (no symlink is followed). A writes rule
// denies or requires approval when any write matches; its class only makes a command
// stricter; a command that writes files is never looser than remote_command. Files a
// program writes through its arguments (tee F, cp A F) are judged by command patterns.
//
// # Wrappers
//
// A wrapper's layer runs another layer: sudo, doas, pkexec, env, nice, ionice, nohup,
// timeout, stdbuf, time, chroot, setsid, xargs, find -exec/-execdir/-ok/-okdir, busybox
// APPLET, sh/bash/dash/zsh/ash/ksh/mksh -c STRING (STRING parsed as a script), the
// shell's command, builtin and exec, zsh's noglob, nocorrect and repeat, runuser (-u USER
// COMMAND, or su's form), su [-] [USER] -c STRING (the user's shell, judged as sh, or -s
// SHELL), sg GROUP [-c] STRING, setpriv, flock (FILE COMMAND, FILE -c STRING, -c STRING,
// --fd N COMMAND), systemd-run (properties running commands, --shell and $VAR in the
// program are unknowable), script -c STRING, watch (its words joined for sh -c; -x runs
// them), GNU parallel (its command string with each argument as a word known only at run
// time; -q), nsenter, unshare, chrt, taskset, cgexec and capsh (-- runs /bin/bash or
// --shell=, == capsh again). Words only known at run time (find's {}, xargs -I's
// replacement, the words xargs or parallel append) are as above. Each wrapper's options
// are those of its current version; an option it does not know, a word known only at
// run time where it reads options or its command, or a form that reads commands from its
// input makes the program unknowable. Any other program is judged as itself, whatever it
// runs: interpreters (python -c, perl -e, awk, node -e), ssh, make, git -c, a script
// file; an allow-list is the control for those.
//
// # Classes
//
// Strictness, strictest first: irreversible > conditional_write > idempotent_write >
// operator-defined classes > remote_command > read_only; ties go to the earlier rule.
// ssh_exec defaults to remote_command; http_request to Request.EndpointClass (or
// idempotent_write when empty) unless an applicable class rule sets one, which then wins
// even when looser (GET on an idempotent_write endpoint may be read_only); other tools get
// the strictest rule class or "".
//
// # Allow-lists
//
// An actor with Default "deny" may only run what applicable allow rules (Decision
// "allow") name: every layer of the command — wrappers, substitutions and sh -c strings
// included — must match an allow rule's command pattern for every value of its run-time
// words, as written (./ls is not ls), or be an inert builtin (cd, echo, printf, test,
// read, set, export, …); an allow rule without patterns allows everything it applies to.
// An unknowable program is denied. For http_request an applicable allow rule (endpoints,
// methods) must name the call. Deny rules still win; approve and class rules still apply.
package policy
