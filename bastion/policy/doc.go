// Package policy decides whether an actor may start an execution, under which action
// class, and whether a person must approve it first. It owns the configured actors, the
// rules, argv parsing of shell commands and the decision ladder; it does no I/O. The
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
//
// # The ladder
//
// Fixed order; the first step that decides ends it, and Decision.Steps records each step:
//
//  1. actor unknown → rejected (actor_unknown)
//  2. the actor may not use the tool (Actor.Tools), the request has no target (ssh_exec
//     without Host, http_request without Endpoint: target_unknown), or the actor may not
//     use the host (Actor.Hosts, globs over the name and "group:<glob>" over its groups)
//     or endpoint (Actor.Endpoints) → rejected (not_allowed)
//  3. the class is computed (below), so every outcome carries one
//  4. any applicable deny rule matches → rejected (denied; unparsable when the command
//     is not plain literal words and the rule has command patterns). Deny wins over
//     approve and class rules whatever their order.
//  5. any applicable approve rule matches → awaiting_approval
//  6. authorized; Decision.Rule names the rule that set the class, or the default.
//
// A rule applies when its Actors list names the actor (or is empty), its Hosts match
// the host or one of its groups (or are empty; a rule with Hosts never applies to a
// request without a host), and its target kind fits the tool: a rule with Commands only
// applies to ssh_exec, a rule with Endpoints or Methods only to http_request (methods
// compare case-insensitively), a rule with neither to every tool.
//
// # Commands
//
// Patterns match the parsed argv (ParseCommand, MatchArgv), never the shell string. A
// script is as strict as its strictest simple command: each simple command of `a; b`,
// `a && b`, `a | b`, newlines, ... is judged on its own and
//
//   - a deny or approve rule fires when ANY simple command matches any of its patterns;
//   - a command's class is the strictest class among the class rules matching it
//     (a rule without Commands matches every command), else remote_command; the script's
//     class is the strictest of its commands' classes. So a class rule only gives a
//     looser class than the default when it matches EVERY simple command, and a script
//     is never looser than any of its parts.
//
// A command named by a path (/bin/rm, ./rm) is judged both as written and under its base
// name (rm), and the stricter reading wins: deny rules on "rm **" see /bin/rm, while an
// allow for "df **" does not loosen ./df (the exact reading keeps the default).
//
// A command that is not safe (ParseCommand: any expansion, substitution, glob, brace or
// tilde, assignment, here-document, redirection other than /dev/null or fd duplication,
// subshell, block, function, compound command, builtin that reinterprets its arguments
// such as eval/source/exec/command/hash/alias/trap, a command name that is not printable
// ASCII — fullwidth or Cyrillic look-alikes —, a parse error, or an empty script) is
// treated as matching every pattern: every applicable deny rule fires (code unparsable),
// else every applicable approve rule fires, and its class is the strictest class of any
// applicable class rule, never looser than remote_command.
//
// # Wrappers
//
// Each simple command is unwrapped (Unwrap) into the layers it would run: itself and, when
// it names a wrapper, the command the wrapper runs, recursively — sudo, doas, env, nice,
// ionice, nohup, timeout, stdbuf, time, chroot, setsid, pkexec, xargs, busybox APPLET,
// find's -exec/-execdir/-ok/-okdir clauses, and sh/bash/dash/zsh/ash/ksh/mksh -c STRING
// (STRING parsed by ParseCommand). Rules see every layer as they see a simple command of a
// script: a deny or approve rule fires when any layer matches, and the class is the
// strictest of the layers' classes — so a wrapper never loosens a class (sudo df keeps the
// default; sudo migrate is irreversible) and a deny on rm sees sudo rm, sh -c 'rm x',
// find -exec rm {} ;. Words only known at run time (find's {}, xargs -I's replacement,
// the words xargs appends) match any pattern word for deny and approve, and only '*' or a
// final "**" for a looser class.
//
// A wrapper whose options or form the unwrapper does not know with certainty makes the
// command not safe (above): an unknown option, sudo -s/-i/-e, doas -s, env -S, a shell
// reading its input (sh with neither -c nor a script file, -i, -s), chroot without a
// command, an assignment to a variable a shell, the loader or a common program runs code
// from (PATH, LD_*, BASH_ENV, PS4, SHELLOPTS, EDITOR, ...), a run-time word where the
// wrapper looks for its options or command (xargs sudo), a command name starting with '-'
// or naming a builtin that reinterprets its arguments (env command rm), more than 16 levels. Any other program is judged as itself, whatever it runs:
// interpreters (python -c, perl -e, awk), su -c, ssh, flock, watch, make, git -c, ...;
// deny or require approval for those explicitly.
//
// # Classes
//
// Strictness, strictest first: irreversible > conditional_write > idempotent_write >
// operator-defined classes > remote_command > read_only; ties go to the earlier rule.
// ssh_exec defaults to remote_command; http_request to Request.EndpointClass (or
// idempotent_write when empty) unless an applicable class rule sets one, which then wins
// even when looser (GET on an idempotent_write endpoint may be read_only); other tools get
// the strictest rule class or "".
package policy
