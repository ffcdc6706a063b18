package api

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Refusal is why a call was turned away (or why an execution did not go ahead) and what the
// caller can do about it. It is the one format of every refusal text an agent reads: the
// tool errors of calls refused before anything was journaled (Err), and the evidence line of
// an execution that policy rejected or held for approval, or that failed because its host
// could not be reached (Text), which results show as their cause.
//
// An agent can only act on a refusal that says what decided (Rule), why in plain words
// (Reason) and what would make the call succeed (Repair); it never names an operator
// command, since an agent cannot run one.
type Refusal struct {
	// Code is the stable code callers branch on (ToolError.Code, or the policy's rejection
	// code).
	Code string
	// Rule is what decided: a policy rule (`rules[2] "no-rm"`), an actor's limit or
	// permission; "" when nothing configurable did.
	Rule string
	// Reason says why, in plain words.
	Reason string
	// Repair says what to change so that the call succeeds ("" when nothing the caller
	// changes would).
	Repair string
	// Next says what is safe to do now.
	Next string
}

// Message is the refusal without its code: the reason (with the rule that decided), the
// repair and the next step, each a sentence.
func (r Refusal) Message() string {
	reason := strings.TrimSpace(r.Reason)
	if r.Rule != "" {
		reason = strings.TrimRight(reason, ".") + " (" + r.Rule + ")"
	}
	parts := []string{sentence(reason)}
	for _, s := range []string{r.Repair, r.Next} {
		if s = strings.TrimSpace(s); s != "" {
			first, n := utf8.DecodeRuneInString(s)
			parts = append(parts, sentence(string(unicode.ToUpper(first))+s[n:]))
		}
	}
	return strings.Join(parts, " ")
}

// Text is the refusal as one line that starts with its code: "denied: … (rules[0] "no-rm").
// Repair. Next."
func (r Refusal) Text() string { return r.Code + ": " + r.Message() }

// Err is the refusal as the tool error of a call refused before anything was journaled.
func (r Refusal) Err() *ToolError { return &ToolError{Code: r.Code, Message: r.Message()} }

// sentence ends s with a full stop unless it ends a sentence already (or is empty).
func sentence(s string) string {
	if s == "" || strings.HasSuffix(s, ".") || strings.HasSuffix(s, "?") || strings.HasSuffix(s, "!") {
		return s
	}
	return s + "."
}
